"""The pipeline's core: a source tree, the series on it, an install, the checks (floor 1)."""
