"""``zero3-sp`` (``python -m patch_and_test``): one command per thing a person does.

Each command is its module's ``main(argv) -> int``, imported by name when it runs and not before: ``zero3-sp
doctor`` loads the doctor and what it imports, nothing else.
"""

from __future__ import annotations

import importlib
import sys

from patch_and_test import DATA_ROOT, PACKAGE_ROOT
from repro.harness import exit_codes

PROG = "zero3-sp"
# A line a command: its name (two words: a command of a group), the module under patch_and_test whose main(argv)
# runs it, what it does.
TABLE = """
run: job.cli: the whole job: the bug before, the series applied, the fix after (tox -e patch-and-test)
doctor: doctor.cli: am I affected? reads this Python's DeepSpeed, your config, model and loss code
affected select: upstream.affected: which of DeepSpeed's own tests a series can reach
affected run: upstream.job: those tests before and after the series, on a DeepSpeed checkout
downstream run: downstream.run: the real clients' sp loss code on DeepSpeed unpatched and patched (tox -m downstream)
downstream check-installed: downstream.clients: which installed clients mis-scale sp gradients with this DeepSpeed
downstream keep: downstream.table: copy the downstream runs' reports into the kept runs that the docs show
bundle: review.bundle: the maintainers' review bundle: build, verify
docs: review.docs: render every generated block and file from kept data; --check: exit 1 naming the stale ones
releases: tools.releases: every DeepSpeed release on PyPI takes its series' fix (downloads the sdists)
lint: tools.lint: DeepSpeed's pre-commit rules on every file the series touch
reroll: tools.reroll: regenerate a series as its next version
signoff: core.signoff: copies of a series signed off by its sender; --check: ready to send?
send: review.send: the pull request's branch on your own DeepSpeed checkout, signed by you and tested there
selftest: tools.selftest: the package's own tests against one DeepSpeed release
install: core.install: install DeepSpeed here: a release from its verified sdist, or a tree
"""
COMMANDS = {
    name: (f"patch_and_test.{module}", what)
    for name, module, what in (line.split(": ", 2) for line in TABLE.strip().splitlines() if line[0] != "#")
}

# What an installed wheel runs; the other commands read and write the checkout (repro/, docs/, tests/, results/).
ANYWHERE = ("doctor", "downstream check-installed", "affected select")


def usage(group: str = "") -> str:
    names = [name for name in COMMANDS if name.startswith(group)]
    width = max(map(len, names))
    head = f"usage: {PROG} {group}COMMAND [ARGS]  ({PROG} COMMAND --help: its own help)\n\ncommands:\n"
    return head + "".join(f"  {name:<{width}}  {COMMANDS[name][1]}\n" for name in names)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words in (2, 1):
        name = " ".join(argv[:words])
        if len(argv) < words or name not in COMMANDS:
            continue
        if DATA_ROOT != PACKAGE_ROOT and name not in ANYWHERE:  # installed, no checkout around it
            print(
                f"error: {PROG} {name} runs in a checkout of zero3-sp-gradfix (python -m patch_and_test {name}); "
                f"installed, {PROG} runs {', '.join(ANYWHERE)}", file=sys.stderr)
            return exit_codes.ERROR
        return importlib.import_module(COMMANDS[name][0]).main(argv[words:])
    group = f"{argv[0]} " if argv and any(name.startswith(f"{argv[0]} ") for name in COMMANDS) else ""
    rest = argv[1:] if group else argv
    if rest[:1] in (["-h"], ["--help"]):
        print(usage(group), end="")
        return exit_codes.HOLDS
    print(usage(group), end="", file=sys.stderr)
    if rest:
        print(f"error: {PROG}: no command {' '.join(argv[:2] if group else argv[:1])!r}", file=sys.stderr)
    return exit_codes.ERROR
