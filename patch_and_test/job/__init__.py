"""The job: the pipeline's steps and their verdict (floor 3)."""
