"""Exit codes of the pipeline and the errors that carry them.

Every user-facing failure is one of these: the CLI prints ``error: <message>`` on one line
and exits with the class's code. Nothing is left half-done when one is raised.
"""

from __future__ import annotations

import argparse
import enum
import sys
from typing import NoReturn

from repro.harness import exit_codes


class Exit(enum.IntEnum):
    OK = 0  # bug seen before, gone after, on every check
    NOT_FIXED = 1  # a check still fails after the series was applied
    ERROR = 2  # bad input or a step could not run
    BUG_NOT_REPRODUCED = 3  # the unpatched DeepSpeed did not show the bug
    SERIES_DOES_NOT_APPLY = 4  # git am failed; the tree was rolled back
    ALREADY_FIXED = 5  # the tree already carries the fix: nothing to apply
    REGRESSION = 6  # a DeepSpeed test the series can reach passed before it and fails after (on every rerun)
    SKIPPED = exit_codes.SKIPPED  # could not run here (e.g. nccl with too few GPUs); the reason is printed


class PipelineError(Exception):
    """A failure with a one-line message and a documented exit code."""

    exit_code: Exit = Exit.ERROR


class BadInput(PipelineError):
    exit_code = Exit.ERROR


class NotACheckout(BadInput):
    pass


class DirtyCheckout(BadInput):
    pass


class UnknownVersion(BadInput):
    pass


class SeriesDoesNotApply(PipelineError):
    exit_code = Exit.SERIES_DOES_NOT_APPLY


class AlreadyFixed(PipelineError):
    exit_code = Exit.ALREADY_FIXED


class Skipped(PipelineError):
    exit_code = Exit.SKIPPED


class CommandParser(argparse.ArgumentParser):
    """Every command's argument parser: a usage error is one line (``error: ...``) and exit 2, like every other
    bad input; ``--help`` still prints the usage."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(int(Exit.ERROR))


def positive_seconds(text: str) -> float:
    """argparse type of a deadline: a number of seconds above 0 (CommandParser makes the error one line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value
