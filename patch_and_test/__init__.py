"""The patch-and-test pipeline: get source -> apply series -> run reproducers -> verdict -> bundle."""
