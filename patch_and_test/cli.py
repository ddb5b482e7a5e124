"""``zero3-sp`` (``python -m patch_and_test``): one command per thing a person does.

Each command is its module's ``main(argv) -> int``, imported by name when it runs and not before: ``zero3-sp
doctor`` loads the doctor and what it imports, nothing else.
"""

from __future__ import annotations

import importlib
import sys

from repro.harness import exit_codes

PROG = "zero3-sp"
# name -> (the module whose main(argv) it runs, what it does); a two-word name is a command of a group.
COMMANDS = {
    "run": ("patch_and_test.job.cli", "the whole job: the bug before, the series applied, the fix after (tox -e "
            "patch-and-test)"),
    "doctor": ("patch_and_test.doctor.cli", "am I affected? reads this Python's DeepSpeed, your config, model and "
               "loss code"),
    "affected select": ("patch_and_test.upstream.affected", "which of DeepSpeed's own tests a series can reach"),
    "affected run": ("patch_and_test.upstream.job", "those tests before and after the series on a DeepSpeed checkout"),
    "downstream run": ("patch_and_test.downstream.run", "the real clients' sp loss code on DeepSpeed unpatched and "
                       "patched (tox -m downstream)"),
    "downstream check-installed": ("patch_and_test.downstream.clients", "which installed clients mis-scale sp "
                                   "gradients with the DeepSpeed installed here"),
    "downstream keep": ("patch_and_test.downstream.table", "copy the downstream runs' reports into the kept runs "
                        "that the docs show"),
    "bundle": ("patch_and_test.review.bundle", "the maintainers' review bundle: build, verify"),
    "docs": ("patch_and_test.review.docs", "render every generated block and file again from kept data; --check: "
             "change nothing, exit 1 naming the stale ones"),
    "releases": ("patch_and_test.tools.releases", "every DeepSpeed release on PyPI takes its series' fix (downloads "
                 "the sdists)"),
    "lint": ("patch_and_test.tools.lint", "DeepSpeed's pre-commit rules on every file the series touch"),
    "reroll": ("patch_and_test.tools.reroll", "regenerate a series as its next version"),
    "signoff": ("patch_and_test.core.signoff", "copies of a series signed off by its sender; --check: ready to send?"),
    # "send": ("patch_and_test.review.send", "..."),
    "selftest": ("patch_and_test.tools.selftest", "the package's own tests against one DeepSpeed release"),
    "install": ("patch_and_test.core.install", "install DeepSpeed here: a release from its verified sdist, or a tree"),
}


def usage(group: str = "") -> str:
    names = [name for name in COMMANDS if name.startswith(group)]
    width = max(map(len, names))
    head = f"usage: {PROG} {group}COMMAND [ARGS]  ({PROG} COMMAND --help: its own help)\n\ncommands:\n"
    return head + "".join(f"  {name:<{width}}  {COMMANDS[name][1]}\n" for name in names)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words in (2, 1):
        if len(argv) >= words and " ".join(argv[:words]) in COMMANDS:
            return importlib.import_module(COMMANDS[" ".join(argv[:words])][0]).main(argv[words:])
    group = f"{argv[0]} " if argv and any(name.startswith(f"{argv[0]} ") for name in COMMANDS) else ""
    rest = argv[1:] if group else argv
    if rest[:1] in (["-h"], ["--help"]):
        print(usage(group), end="")
        return exit_codes.HOLDS
    print(usage(group), end="", file=sys.stderr)
    if rest:
        print(f"error: {PROG}: no command {' '.join(argv[:2] if group else argv[:1])!r}", file=sys.stderr)
    return exit_codes.ERROR
