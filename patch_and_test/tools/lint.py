"""Check the series against DeepSpeed's pre-commit rules, on trees with the series applied.

    zero3-sp lint                 # every series, on the git mirror (else on sdists)
    zero3-sp lint --tree ~/ds     # the series for that checkout, on a copy of it

Each series is applied (``git am``) to a working copy: of ``--tree``, else of the DeepSpeed mirror
(``$DEEPSPEED_MIRROR``) at the series' base commit, else, on a machine without the mirror, of the
PyPI sdist of the newest locked version the series covers (the sdist has no ``tests/``: the test
patches are then not linted, and the report says so). Every file the series touches is checked:

* yapf (the tree's ``.style.yapf``, else pep8 with column_limit 119)
* flake8 ``--select=E9,F,W6`` (the tree's ``.flake8``, else a copy of DeepSpeed's)
* codespell with DeepSpeed's arguments
* trailing whitespace, final newline, CRLF
* the ``SPDX-License-Identifier: Apache-2.0`` and ``DeepSpeed Team`` header
* no ``torch.distributed`` but ``torch.distributed.nn``; no ``torch.cuda`` without ``#ignore-cuda``,
  no ``.cuda()``, no ``.is_cuda`` (DeepSpeed's check-torchdist / check-torchcuda, with their excludes)

and every patch is signed off by its author (DCO). yapf, flake8 and codespell run at the versions
DeepSpeed's pre-commit uses, pinned in requirements/pins.txt. Exit 0: no finding; 1: findings, one
per line; 2: could not run (a tool missing, the series does not apply, ...).
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from patch_and_test.core import errors
from patch_and_test.core import pins
from patch_and_test.core import source
from patch_and_test.core.signoff import check_signoff
from patch_and_test.core.series import (Manifest, Series, apply_series, load_manifest, parse_version, series_for_tree,
                                        touched_files)

TOOLS = {name: pins.version(name) for name in ("yapf", "flake8", "codespell")}  # requirements/pins.txt
DEFAULT_YAPF_STYLE = "{based_on_style: pep8, column_limit: 119}"
# DeepSpeed's .flake8, for trees that lack it (PyPI sdists ship no dotfiles).
DEFAULT_FLAKE8 = ("--select=E9,F,W6", "--ignore=E,F403,F405,F541,F841,W", "--per-file-ignores=__init__.py:F401")
# DeepSpeed's codespell arguments (.pre-commit-config.yaml, the same from v0.14 to master).
CODESPELL_ARGS = ("--ignore-regex=\\n", "--ignore-words-list=youn,unsupport,noe,cann", "--check-filenames",
                  "--check-hidden")
SPDX = re.compile(r"^(#|//) SPDX-License-Identifier: Apache-2.0( AND BSD-3-Clause)?$", re.M)
TEAM = re.compile(r"^(#|//) DeepSpeed Team$", re.M)
LICENSED_SUFFIXES = (".py", ".c", ".cpp", ".cu", ".cc", ".h", ".hpp", ".cuh", ".hip", ".tr")
# DeepSpeed's check-torchdist and check-torchcuda, line by line: (a line it refuses, the files' suffix, why).
LINE_RULES = {
    "check-torchdist": [(re.compile(r"torch\.distributed |torch\.distributed(?!\.nn)"), "",
                         "torch.distributed: use deepspeed.comm (torch.distributed.nn is allowed)")],
    "check-torchcuda": [(re.compile(r"^(?!.*#ignore-cuda).*torch\.cuda"), "",
                         "torch.cuda: use get_accelerator() (or mark the line #ignore-cuda)"),
                        (re.compile(r"\.cuda\(\)"), "", ".cuda(): use .to(get_accelerator().device_name())"),
                        (re.compile(r"\.is_cuda"), ".py", ".is_cuda: use get_accelerator().on_accelerator(tensor)")],
}


@dataclass(frozen=True)
class Finding:
    where: str  # path (relative to the tree) or patch file name
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: [{self.check}] {self.message}"


@dataclass(frozen=True)
class LintedSeries:
    series: str
    tree: source.SourceTree
    files: tuple[str, ...]
    findings: tuple[Finding, ...]
    not_linted: tuple[str, ...]  # patches skipped on this tree, with why


@functools.lru_cache(maxsize=None)
def _tool(name: str) -> tuple[str, ...]:
    """The tool's command, from this interpreter's environment or PATH, at DeepSpeed's version."""
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        raise errors.BadInput(
            f"{name} is not installed: pip install {' '.join(f'{t}=={v}' for t, v in TOOLS.items())}")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True)
    found = re.search(r"\d+\.\d+\.\d+", out.stdout + out.stderr)
    if not found or found[0] != TOOLS[name]:
        raise errors.BadInput(f"{name} {found[0] if found else '?'} found at {exe}; DeepSpeed's rules need "
                              f"{name}=={TOOLS[name]}")
    return (exe, )


def _hook_excludes(tree: Path | None, hook: str, rel: str) -> bool:
    """Whether the ``exclude:`` regex of a local hook in the tree's .pre-commit-config.yaml matches ``rel``."""
    config = tree / ".pre-commit-config.yaml" if tree else None
    if config is None or not config.is_file():
        return False
    block = re.search(rf"id: {re.escape(hook)}\n(.*?)(?=\n\s*-\s+(?:id|repo):|\Z)", config.read_text(), re.S)
    exclude = re.search(r"^\s*exclude:\s*(\S.*)$", block[1], re.M) if block else None
    return bool(exclude and re.search(exclude[1].strip().strip("'\""), rel))


def check_text(rel: str, text: str, tree: Path | None = None) -> list[Finding]:
    """The checks that need no external tool: whitespace, header, torch.distributed, torch.cuda."""
    findings: list[Finding] = []
    if "\r\n" in text:
        findings.append(Finding(rel, "mixed-line-ending", "CRLF line endings"))
    if text and not text.endswith("\n"):
        findings.append(Finding(rel, "end-of-file-fixer", "no newline at end of file"))
    elif text.endswith("\n\n"):
        findings.append(Finding(rel, "end-of-file-fixer", "blank lines at end of file"))
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line != line.rstrip():
            findings.append(Finding(f"{rel}:{number}", "trailing-whitespace", "trailing whitespace"))
    if rel.endswith(LICENSED_SUFFIXES):
        if not SPDX.search(text):
            findings.append(Finding(rel, "check-license", "no '# SPDX-License-Identifier: Apache-2.0' line"))
        if not TEAM.search(text):
            findings.append(Finding(rel, "check-license", "no '# DeepSpeed Team' line"))
    for hook, rules in LINE_RULES.items():
        if not _hook_excludes(tree, hook, rel):
            findings += [
                Finding(f"{rel}:{number}", hook, why) for number, line in enumerate(lines, 1)
                for refused, suffix, why in rules if rel.endswith(suffix) and refused.search(line)
            ]
    return findings


def check_cover(series: Series) -> list[Finding]:
    text = series.cover_letter.read_text() if series.cover_letter.is_file() else ""
    match = re.search(r"^base-commit: ([0-9a-f]{40})$", text, re.M)
    if not match:
        return [Finding(series.cover_letter.name, "base-commit", "cover letter without base-commit:")]
    if match[1] != series.base_commit:
        why = f"base-commit {match[1][:12]} is not the manifest's {series.base_commit[:12]}"
        return [Finding(series.cover_letter.name, "base-commit", why)]
    if not re.search(r"^change-id: \S+$", text, re.M):
        return [Finding(series.cover_letter.name, "change-id", "cover letter without b4's change-id:")]
    if "*** SUBJECT HERE ***" in text or "*** BLURB HERE ***" in text:
        return [Finding(series.cover_letter.name, "cover-letter", "placeholder text left in the cover letter")]
    return []


def run_tools(tree: Path, files: list[str]) -> list[Finding]:
    findings: list[Finding] = []
    py = [f for f in files if f.endswith(".py") and (tree / f).is_file()]
    style = str(tree / ".style.yapf") if (tree / ".style.yapf").is_file() else DEFAULT_YAPF_STYLE
    if py:
        out = subprocess.run([*_tool("yapf"), "--diff", f"--style={style}", *py], cwd=tree, capture_output=True,
                             text=True)
        if out.returncode != 0 and not out.stdout:
            findings.append(Finding(",".join(py), "yapf", f"yapf failed: {out.stderr.strip()[:200]}"))
        # One "--- path (original)" section per file that yapf would change.
        for section in re.split(r"(?m)^(?=--- )", out.stdout):
            header = re.match(r"--- (\S+)", section)
            if header:
                changed = sum(line.startswith("+") and not line.startswith("+++") for line in section.splitlines())
                findings.append(Finding(header[1], "yapf", f"yapf {TOOLS['yapf']} would reformat {changed} line(s)"))
        config = ["--config=.flake8"] if (tree / ".flake8").is_file() else list(DEFAULT_FLAKE8)
        out = subprocess.run([*_tool("flake8"), *config, *py], cwd=tree, capture_output=True, text=True)
        for line in out.stdout.splitlines():
            where, _, message = line.partition(": ")
            findings.append(Finding(where.rsplit(":", 1)[0], "flake8", message))
        if out.returncode not in (0, 1) or (out.returncode == 1 and not out.stdout):
            findings.append(Finding(",".join(py), "flake8", f"flake8 failed: {out.stderr.strip()[:200]}"))
    existing = [f for f in files if (tree / f).is_file()]
    if existing:
        out = subprocess.run([*_tool("codespell"), *CODESPELL_ARGS, *existing], cwd=tree, capture_output=True,
                             text=True)
        for line in out.stdout.splitlines():
            where, _, message = line.partition(": ")
            findings.append(Finding(where, "codespell", message))
    for rel in existing:
        findings.extend(check_text(rel, (tree / rel).read_text(), tree))
    return findings


def lint_series(series: Series, tree: source.SourceTree) -> LintedSeries:
    result = apply_series(tree.path, series)
    files = touched_files(*(p.path for p in series.patches if p.file in result.applied))
    findings = run_tools(tree.path, files)
    findings += [Finding(patch.file, "dco", why) for patch in series.patches for why in check_signoff(patch.path)]
    findings.extend(check_cover(series))
    return LintedSeries(series=series.name, tree=tree, files=tuple(files), findings=tuple(findings),
                        not_linted=tuple(f"{s.file} ({s.reason})" for s in result.skipped))


def trees_for(manifest: Manifest, tree: Path | None, unlinted: list[str]) -> list[tuple[Series, source.SourceTree]]:
    """(series, tree to lint it on) pairs; without the mirror, a series with no locked sdist goes to ``unlinted``."""
    if tree is not None:
        copy = source.from_checkout(tree)
        return [(series_for_tree(copy.path, manifest), copy)]
    mirror = source.mirror_path()
    if mirror.exists():
        return [(s, source.from_series_base(s, mirror, branch=f"zero3-sp-lint/{s.name}")) for s in manifest.series]
    lock = source.load_lock()
    newest = source.load_newest_upstream().release
    pairs = []
    for series in manifest.series:
        # A series made on the newest-upstream graft takes that release's sdist: its code is the graft's.
        covered = [newest] if series.base_ref == source.NEWEST_UPSTREAM else sorted(
            (v for v in lock if series.covers(parse_version(v))), key=parse_version)
        if not covered:
            why = f"series {series.name}: NOT LINTED: no mirror at {mirror} and no locked sdist in {series.range_text}"
            unlinted.append(why)
            continue
        pairs.append((series, source.from_pypi(covered[-1])))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = errors.CommandParser(
        prog="zero3-sp lint", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1] + "\npinned: " + " ".join(f"{t}=={v}" for t, v in TOOLS.items()) + "\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, help="a DeepSpeed git checkout (only read: a copy is patched)")
    parser.add_argument("--manifest", type=Path, help="patches/series.toml (default: the package's)")
    args = parser.parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
        for name in TOOLS:
            _tool(name)
        unlinted: list[str] = []
        reports = [lint_series(series, tree) for series, tree in trees_for(manifest, args.tree, unlinted)]
    except errors.PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(errors.Exit.ERROR)
    for line in unlinted:
        print(line)
    for report in reports:
        tree, commit = report.tree, report.tree.upstream_commit
        graft = f" ({tree.graft.release} sdist on master {tree.graft.history[:12]})" if tree.graft else ""
        where = {
            "mirror": f"sparse checkout of the mirror at {commit}",
            "checkout": f"copy of the checkout at {commit}",
            "pypi-sdist": f"PyPI sdist of DeepSpeed {tree.version}",
            source.NEWEST_UPSTREAM: f"the newest-upstream tree {commit}{graft}",
        }[tree.origin]
        print(f"series {report.series}: {where} ({tree.path})")
        for item in report.not_linted:
            print(f"  not linted: {item}")
        if tree.origin == "pypi-sdist" and report.not_linted:
            print("  no DeepSpeed mirror here: the test patches were not linted")
        for finding in report.findings:
            print(f"  {finding}")
        print(f"  {len(report.files)} file(s): {', '.join(report.files)}: "
              f"{'OK' if not report.findings else f'{len(report.findings)} finding(s)'}")
    return 1 if any(report.findings for report in reports) else 0  # 1: findings (the report above); 2: could not lint
