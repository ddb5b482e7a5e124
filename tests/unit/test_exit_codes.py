"""Exit code 77 ("skipped") and its siblings are defined once: repro/harness/exit_codes.py."""

from __future__ import annotations

import ast
from pathlib import Path

import toxfile
from patch_and_test.job.cli import EXIT_HELP
from patch_and_test.core.errors import Exit, exit_codes_help, exit_codes_markdown
from repro.harness import exit_codes

ROOT = Path(__file__).resolve().parents[2]


def test_every_user_of_the_codes_reads_the_one_definition():
    assert Exit.SKIPPED == toxfile.SKIPPED == exit_codes.SKIPPED == 77
    assert (exit_codes.HOLDS, exit_codes.DOES_NOT_HOLD, exit_codes.ERROR) == (Exit.OK, Exit.NOT_FIXED, Exit.ERROR)
    assert exit_codes.INTERRUPTED == 130


def test_no_code_writes_77_as_a_bare_number():
    """Docstrings and help texts may say 77; code compares with and returns the named constant."""
    found = []
    for path in [
            *ROOT.glob("repro/**/*.py"), *ROOT.glob("patch_and_test/**/*.py"), ROOT / "toxfile.py",
            ROOT / "noxfile.py", *ROOT.glob("benchmarks/*.py")
    ]:
        if path.name == "exit_codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value == 77:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_readme_table_is_the_rendered_one():
    """README's table of patch-and-test's exit codes is errors.Exit's, rendered (exit_codes_markdown, by docs)."""
    from patch_and_test.core.templating import block_of
    from patch_and_test.review.docs import EXIT_CODES

    assert block_of((ROOT / "README.md").read_text(), *EXIT_CODES) + "\n" == exit_codes_markdown()


def test_the_table_has_one_row_per_code_and_the_help_renders_it():
    rows = exit_codes_markdown().splitlines()[2:]
    assert [int(r.split(" | ")[0].strip("| ")) for r in rows] == [int(e) for e in Exit] == [0, 1, 2, 3, 4, 5, 6, 77]
    assert len({e.outcome for e in Exit}) == len(Exit)
    assert EXIT_HELP.startswith(exit_codes_help())
    assert all(f"  {int(e):<3} {e.outcome}: " in EXIT_HELP for e in Exit)
