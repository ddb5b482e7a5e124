"""Maintainers' tools: reroll, lint, the releases table, the package's own tests (floor 2)."""
