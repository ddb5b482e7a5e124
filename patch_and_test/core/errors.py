"""Exit codes of the pipeline and the errors that carry them: a user-facing failure is one of these, printed as
``error: <message>`` on one line, the exit code the class's; nothing is left half-done when one is raised.
"""

from __future__ import annotations

import argparse
import enum
import sys
import textwrap
from typing import NoReturn

from repro.harness import exit_codes


class Exit(enum.IntEnum):
    """The exit codes of ``zero3-sp run``, each with its outcome (verdict.json's ``outcome``) and
    meaning: the one table the CLI's help, README's table (``exit_codes_markdown``) and the docstrings read."""

    def __new__(cls, code: int, outcome: str, meaning: str) -> "Exit":
        member = int.__new__(cls, code)
        member._value_ = code
        member.outcome, member.meaning = outcome, meaning
        return member

    OK = 0, "fixed", "the bug was seen before and is gone after, on every check"
    NOT_FIXED = 1, "not-fixed", "a check still fails with the series applied"
    ERROR = 2, "error", "bad input (not a checkout, dirty tree, unknown version, ...) or a check could not run"
    BUG_NOT_REPRODUCED = 3, "bug-not-reproduced", "the unpatched DeepSpeed did not show the known pattern"
    SERIES_DOES_NOT_APPLY = (4, "series-does-not-apply",
                             "git am failed; the tree was rolled back (your checkout is never touched)")
    ALREADY_FIXED = 5, "already-fixed", "the source already carries the fix: nothing to apply"
    REGRESSION = (6, "regression", "a DeepSpeed test the series can reach passed before it and fails after, on every "
                  "rerun (or a test the series adds fails)")
    SKIPPED = (exit_codes.SKIPPED, "skipped", "could not run here (e.g. nccl with fewer GPUs than ranks); the reason "
               "is printed as `skipped: <reason>`")


def exit_codes_help() -> str:
    """The ``exit codes:`` section of ``zero3-sp run --help``."""
    return "exit codes:\n" + "".join(
        textwrap.fill(f"{e.outcome}: {e.meaning}", 100, initial_indent=f"  {e.value:<3} ", subsequent_indent=" " * 6) +
        "\n" for e in Exit)


def exit_codes_markdown() -> str:
    """README's table of the exit codes (``zero3-sp docs`` renders it there)."""
    return "| exit | outcome |\n|---|---|\n" + "".join(f"| {e.value} | {e.outcome}: {e.meaning} |\n" for e in Exit)


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
    """Every command's argument parser: a usage error is one line (``error: ...``) and exit 2, like bad input."""

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
