"""The exit codes every program of the package speaks. Pure: tox's plugin (toxfile.py) loads it by path."""

HOLDS = 0  # the expectation holds
DOES_NOT_HOLD = 1  # it does not (under --expect fixed: the bug is reproduced)
ERROR = 2  # could not run: bad input, a rank crashed, the deadline passed
SKIPPED = 77  # could not run here (e.g. nccl with fewer GPUs than ranks); a one-line reason is printed
INTERRUPTED = 130  # Ctrl-C, or SIGTERM while ranks run; every rank torn down first (the shell's 128 + SIGINT)
