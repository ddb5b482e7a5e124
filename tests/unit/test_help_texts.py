"""Every command-line flag of every entry point says what it does (``--help`` is the user's first reference)."""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class _Parsed(BaseException):
    """Raised in place of parsing: no handler of the entry point catches a BaseException subclass."""


def _entry_modules() -> list[str]:
    """Modules whose ``main(argv)`` builds a parser: the package's commands, the reproducers, the benchmarks."""
    found = []
    for path in sorted(
        [*ROOT.glob("patch_and_test/**/*.py"), *ROOT.glob("repro/**/*.py"), *ROOT.glob("benchmarks/*.py")]):
        text = path.read_text()
        if not any(word in text for word in ("ArgumentParser(", "CommandParser(", "main_guard(", "build_parser(")):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == "main" and node.args.args:
                if node.args.args[0].arg == "argv":
                    found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def _parser_of(module: str, monkeypatch) -> argparse.ArgumentParser:
    caught = []

    def capture(self, *args, **kwargs):
        caught.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Parsed):
        importlib.import_module(module).main([])
    return caught[0]


def test_the_entry_points_are_found():
    assert len(_entry_modules()) >= 20, _entry_modules()


def _without_help(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _without_help(sub, f"{prefix}{name} ")
        elif action.help != argparse.SUPPRESS and not (action.help or "").strip():
            missing.append(prefix + ("/".join(action.option_strings) or action.dest))
    return missing


@pytest.mark.parametrize("module", _entry_modules())
def test_every_flag_has_help(module, monkeypatch):
    missing = _without_help(_parser_of(module, monkeypatch))
    assert not missing, f"{module}: flags without help: {missing}"
