"""DeepSpeed's own tests: which a series reaches, and their runs before and after (floor 2)."""
