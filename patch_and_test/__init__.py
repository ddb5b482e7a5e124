"""The patch-and-test pipeline: source -> series -> reproducers -> verdict -> bundle."""
