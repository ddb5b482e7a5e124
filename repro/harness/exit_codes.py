"""The exit codes every program of the package speaks. Pure: tox's plugin (toxfile.py) loads it by path."""

HOLDS, DOES_NOT_HOLD, ERROR, SKIPPED, INTERRUPTED = 0, 1, 2, 77, 130

# What each means, as every reproducer's --help says it (cli renders it). Under --expect fixed, DOES_NOT_HOLD is
# the bug reproduced; INTERRUPTED is the shell's 128 + SIGINT.
MEANINGS = {
    HOLDS: "the expectation (--expect, above) holds",
    DOES_NOT_HOLD: "it does not hold",
    ERROR: "could not run: bad input, a rank crashed or the deadline passed",
    SKIPPED: "skipped, with a one-line reason (e.g. nccl with fewer GPUs than ranks)",
    INTERRUPTED: "interrupted (Ctrl-C, or SIGTERM while ranks run); every rank was stopped first",
}
