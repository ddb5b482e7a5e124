"""Which of DeepSpeed's test files can reach the code a series changes. Pure logic, plus file reads.

The rule is docs/affected-tests.md's "The selection rule".
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import re
import sys
from pathlib import Path
from typing import Iterable

from patch_and_test.core.errors import CommandParser
from repro.harness.files import write_json
from repro.harness.report import Record

MIN_NAME_LENGTH = 4
GENERIC_SHARE = 0.10  # a name in more than this share of the test files selects nothing ...
GENERIC_MIN_FILES = 5  # ... unless it is in this many files or fewer (a small tree)
NON_SOURCE_DIRS = ("tests/", "docs/", "blogs/", "benchmarks/", "examples/")
_SELF_ATTR = re.compile(r"(?<![A-Za-z0-9_.])(?:self|cls)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_STRING = re.compile(r"(?:[rbfuRBFU]{0,2})(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\")")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_HEADER_NAME = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")


@dataclasses.dataclass(frozen=True)
class Hunk:
    header: str  # git's function context after the second @@
    removed: tuple[tuple[int, str], ...]  # (old line number, text)
    added: tuple[tuple[int, str], ...]  # (old line number it is inserted before, text)


@dataclasses.dataclass(frozen=True)
class FileChange:
    path: str
    patch: str  # the patch file that changes it
    hunks: tuple[Hunk, ...]


class ChangedName(Record):
    name: str
    kind: str  # "enclosing" | "reads"
    where: str  # "<file>: <patch>"
    also_as: tuple[str, ...] = ()  # the mangled spelling of a private method


class SelectedFile(Record):
    path: str  # relative to the tree, e.g. tests/unit/v1/moe/test_autoep_unit.py
    reasons: tuple[str, ...]


class Selection(Record):
    files: tuple[SelectedFile, ...]
    names: tuple[ChangedName, ...]  # the names that selected
    generic: tuple[str, ...]  # changed names dropped as too generic
    helpers: tuple[SelectedFile, ...]  # non-test modules under tests/ that name a changed name (not followed)
    test_files_scanned: int

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def describe(self) -> str:
        lines = [f"{len(self.files)} of {self.test_files_scanned} test files can reach the series' changes:"]
        lines += [f"  {f.path}: {'; '.join(f.reasons)}" for f in self.files]
        if self.generic:
            lines.append(f"  (too generic to select: {', '.join(self.generic)})")
        lines += [f"  (helper, not followed: {h.path}: {'; '.join(h.reasons)})" for h in self.helpers]
        return "\n".join(lines)


def parse_patch(text: str, patch_name: str = "") -> list[FileChange]:
    """Every file a ``git format-patch`` / unified diff changes, with its hunks."""
    files: list[list] = []  # [path, hunks] of each file; its "+++" line may rename the path
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("diff --git "):
            files.append([line.split(" b/", 1)[-1], []])
        elif line.startswith("+++ ") and files and (target := line[4:].strip()) != "/dev/null":
            files[-1][0] = target.removeprefix("b/")
        elif (m := _HUNK.match(line)) and files:
            old_line, old_left, new_left = int(m.group(1)), int(m.group(2) or 1), int(m.group(4) or 1)
            removed, added = [], []
            while (old_left > 0 or new_left > 0) and (body := next(lines, None)) is not None:
                tag, rest = body[:1], body[1:]
                if tag == "-":
                    removed.append((old_line, rest))
                    old_line, old_left = old_line + 1, old_left - 1
                elif tag == "+":
                    added.append((old_line, rest))
                    new_left -= 1
                elif tag != "\\":  # context (a blank one may have lost its space); not "\ No newline at end of file"
                    old_line, old_left, new_left = old_line + 1, old_left - 1, new_left - 1
            files[-1][1].append(Hunk(m.group(5).strip(), tuple(removed), tuple(added)))
    return [FileChange(path, patch_name, tuple(hunks)) for path, hunks in files]


def numbered_patches(series_dir: Path) -> list[Path]:
    """A series folder's numbered patches, in order, without the cover letter (it changes nothing)."""
    return [p for p in sorted(series_dir.glob("[0-9][0-9][0-9][0-9]-*.patch")) if not p.name.startswith("0000-")]


def patch_changes(patches: Iterable[Path]) -> list[FileChange]:
    """The changes of these patch files, in order."""
    return [c for p in patches for c in parse_patch(p.read_text(errors="replace"), p.name)]


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.startswith("tests/") and name.endswith(".py") and (name.startswith("test_")
                                                                   or name.endswith("_test.py"))


def _code_names(text: str) -> set[str]:
    """The ``self.X`` / ``cls.X`` attributes a line of code reads or sets, without its strings and comment."""
    return set(_SELF_ATTR.findall(_STRING.sub(" ", text).split("#", 1)[0]))


def _definitions(source: str) -> list[tuple[int, int, str, str]] | None:
    """(first line, last line, kind, name) of every class and def, outermost first; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    defs = [(min([n.lineno] + [d.lineno for d in n.decorator_list]), (n.end_lineno or n.lineno),
             "class" if isinstance(n, ast.ClassDef) else "def", n.name) for n in nodes]
    return sorted(defs, key=lambda d: (d[0], -d[1]))


def _enclosing(defs: list[tuple[int, int, str, str]], line: int) -> list[tuple[str, str]]:
    """The chain (outermost first) of (kind, name) that contains ``line``."""
    return [(kind, name) for first, last, kind, name in defs if first <= line <= last]


def mangled(name: str, chain: list[tuple[str, str]]) -> tuple[str, ...]:
    """How a private ``__name`` defined in a class reads from outside it: ``_Class__name``."""
    classes = [n for kind, n in chain if kind == "class"]
    if not name.startswith("__") or name.endswith("__") or not classes:
        return ()
    return (f"_{classes[-1].lstrip('_')}{name}", )


def changed_names(changes: list[FileChange], tree: Path) -> list[ChangedName]:
    """The names each source hunk changes (its enclosing definitions) or newly reads (its added lines)."""
    found: dict[tuple[str, str], ChangedName] = {}

    def add(name: str, kind: str, where: str, also_as: tuple[str, ...] = ()) -> None:
        if (name, kind) not in found:
            found[name, kind] = ChangedName(name=name, kind=kind, where=where, also_as=also_as)

    for change in changes:
        if not change.path.endswith(".py") or change.path.startswith(NON_SOURCE_DIRS):  # not DeepSpeed's code
            continue
        where = f"{change.path}: {change.patch}" if change.patch else change.path
        pre = tree / change.path
        defs = _definitions(pre.read_text(errors="replace")) if pre.is_file() else None
        for hunk in change.hunks:
            if defs is not None:
                for line in sorted({n for n, _ in hunk.removed + hunk.added}):
                    chain = _enclosing(defs, line)
                    # A line inserted right after a def's last line belongs to that def's body too.
                    if not chain and line > 1:
                        chain = _enclosing(defs, line - 1)
                    for kind, name in chain:
                        add(name, "enclosing", where, mangled(name, chain))
            elif (m := _HEADER_NAME.match(hunk.header)):
                add(m.group(1), "enclosing", where)
            old = set().union(*(_code_names(t) for _, t in hunk.removed))
            new = set().union(*(_code_names(t) for _, t in hunk.added))
            for name in sorted(new - old):
                add(name, "reads", where)
    return list(found.values())


def _named_in(text: str, n: ChangedName) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(s)}(?![A-Za-z0-9_])", text) for s in (n.name, *n.also_as))


def select(changes: list[FileChange], tree: Path) -> Selection:
    """The test files of ``tree`` (as it is before the series) that the changes can reach, and why."""
    found = sorted(str(p.relative_to(tree)) for p in (tree / "tests").rglob("*.py"))
    tests = [f for f in found if is_test_file(f)]
    texts = {t: (tree / t).read_text(errors="replace") for t in tests}
    reasons: dict[str, list[str]] = {}
    for change in changes:
        if is_test_file(change.path):
            reasons.setdefault(change.path, []).append(f"edited by the series ({change.patch or 'diff'})")

    names, generic = [], []
    for n in changed_names(changes, tree):
        if (keyword.iskeyword(n.name) or n.name in dir(builtins) or n.name in ("self", "cls")
                or (n.name.startswith("__") and n.name.endswith("__")) or len(n.name) < MIN_NAME_LENGTH):
            generic.append(n.name)
            continue
        hits = [t for t in tests if _named_in(texts[t], n)]
        if len(hits) > max(GENERIC_MIN_FILES, GENERIC_SHARE * len(tests)):
            generic.append(f"{n.name} ({len(hits)} files)")
            continue
        names.append(n)
        for t in hits:
            reasons.setdefault(t, []).append(f"names {n.name} ({'changed' if n.kind == 'enclosing' else 'newly read'}"
                                             f" in {n.where.split(':')[0]})")

    helpers = []
    for h in (f for f in found if not is_test_file(f) and f.rsplit("/", 1)[-1] not in ("__init__.py", "conftest.py")):
        text = (tree / h).read_text(errors="replace")
        why = tuple(f"names {n.name}" for n in names if _named_in(text, n))
        if why:
            helpers.append(SelectedFile(path=h, reasons=why))
    files = tuple(SelectedFile(path=p, reasons=tuple(dict.fromkeys(r))) for p, r in sorted(reasons.items()))
    return Selection(files=files, names=tuple(names), generic=tuple(sorted(set(generic))), helpers=tuple(helpers),
                     test_files_scanned=len(tests))


def select_for_series(series_dir: Path, tree: Path) -> Selection:
    return select(patch_changes(numbered_patches(series_dir)), tree)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="zero3-sp affected select",
                           description="The DeepSpeed test files a series can reach, with the reason for each.")
    parser.add_argument("series", type=Path, help="a series folder (patches/<name>)")
    parser.add_argument("tree", type=Path, help="a DeepSpeed tree as it is before the series")
    parser.add_argument("--json", type=Path, help="also write the selection as JSON")
    args = parser.parse_args(argv)
    if not (args.tree / "tests").is_dir():
        print(f"error: {args.tree} has no tests/ folder", file=sys.stderr)
        return 2
    if not any(args.series.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        print(f"error: {args.series} holds no numbered patches", file=sys.stderr)
        return 2
    selection = select_for_series(args.series, args.tree)
    print(selection.describe())
    if args.json:
        write_json(args.json, selection.model_dump(mode="json"))
    return 0
