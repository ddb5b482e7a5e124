"""What every family of reproducers shares (CONTRIBUTING.md, "Layout", lists its modules)."""
