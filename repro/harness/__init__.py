"""What every program of the package shares: exit codes (and, as the redesign goes on, launch and CLI)."""
