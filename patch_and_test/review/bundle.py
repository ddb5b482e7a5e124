"""The maintainer review bundle: the series, PR.md, EVIDENCE.md and SENDING.md, and the runs behind every number.

``build`` (the default; ``tox -e bundle``) runs or reuses every matrix cell this machine can run and writes
``dist/<name>-v<series version>/`` and its tarball. ``verify [PATH]`` (``tox -e verify-bundle``) re-checks every
hash and report, and re-renders PR.md, EVIDENCE.md and SENDING.md from the bundle's own files: any edited number,
byte or file fails.

More: docs/code/patch-and-test-review-upstream.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tarfile
import time
import urllib.parse
from itertools import zip_longest
from pathlib import Path

from pydantic import ValidationError

from patch_and_test import PACKAGE_ROOT
from patch_and_test.downstream import table as downstream_table
from patch_and_test.review import docs, github_form
from patch_and_test.core import inputs
from patch_and_test.core import signoff
from patch_and_test.core import source
from patch_and_test.core.errors import CommandParser, Exit, PipelineError, positive_seconds
from patch_and_test.core.series import load_manifest, parse_version, series_for_version
from patch_and_test.review.pr import (ISSUE, KEPT as KEPT_AFFECTED, MAX_LINES, PAGES, load_context, local_links,
                                      nonblank_lines, write_pages)
from patch_and_test.job.verdict import Verdict

NAME = "zero3-sp-gradfix"
BACKENDS = ("gloo", "nccl")
MANIFEST = "MANIFEST.sha256"
EVIDENCE_DIRS = ("alst", "audit", "benchmarks")  # written by other checks, copied when present
COMMITTED_BENCHMARKS = PACKAGE_ROOT / "benchmarks" / "results"
DOWNSTREAM = "downstream"  # results/downstream: tox -m downstream (the real clients' sp loss code)
AFFECTED = "affected"  # results/affected/<tree>/ (zero3-sp affected run), over the kept runs
GOOD_OUTCOMES = ("fixed", "skipped")


@dataclasses.dataclass(frozen=True)
class Cell:
    version: str
    backend: str

    @property
    def env(self) -> str:
        return f"patch-and-test-ds{self.version}-{self.backend}"


def matrix() -> list[Cell]:
    return [Cell(v, b) for v in sorted(source.load_lock(), key=parse_version) for b in BACKENDS]


def reusable(verdict_path: Path, expected: inputs.RunInputs) -> bool:
    """A verdict that validates and was made from the same inputs (one that does not validate is run again)."""
    try:
        return verdict_path.exists() and Verdict.load(verdict_path).inputs == expected
    except ValueError:
        return False


def ensure_results(results: Path, cells: list[Cell], timeout: float, audit: bool = True) -> dict[str, str]:
    """Run the cells whose results are missing or stale; return env -> "reused" | "ran"."""
    from patch_and_test.job.pipeline import PipelineConfig, run

    done, lock, manifest = {}, source.load_lock(), load_manifest()
    for cell in cells:
        expected = inputs.run_inputs(
            series_for_version(cell.version, manifest).directory, lock[cell.version].sha256, cell.backend, audit)
        if reusable(results / cell.env / "verdict.json", expected):
            done[cell.env] = "reused"
            continue
        print(f"[bundle] running {cell.env}", flush=True)
        shutil.rmtree(results / cell.env, ignore_errors=True)
        run(
            PipelineConfig(env_name=cell.env, results=results / cell.env, version=cell.version, backend=cell.backend,
                           timeout=timeout, audit=audit))
        done[cell.env] = "ran"
    return done


def build(results: Path, dist: Path, cells: list[Cell], timeout: float, audit: bool = True,
          sign_as: tuple[str, str] | None = None) -> Path:
    started = time.monotonic()
    status = ensure_results(results, cells, timeout, audit)
    bundle = dist / f"{NAME}-v{max(s.version for s in load_manifest().series)}"
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(PACKAGE_ROOT / "patches", bundle / "patches")  # makes the bundle's folder too
    if sign_as is not None:
        for folder in sorted(p.parent for p in (bundle / "patches").glob("*/0000-cover-letter.patch")):
            signoff.resign(PACKAGE_ROOT / "patches" / folder.name, folder, *sign_as)
    if COMMITTED_BENCHMARKS.is_dir():  # kept runs (timing needs a quiet machine); newer local runs win
        shutil.copytree(COMMITTED_BENCHMARKS, bundle / "results" / "benchmarks")
    envs = [c.env for c in cells] + sorted(p.name for p in results.glob("patch-and-test-src*"))
    for name in [*envs, *EVIDENCE_DIRS]:  # the cells' results, then the evidence other checks wrote
        if (results / name).is_dir():
            shutil.copytree(results / name, bundle / "results" / name, ignore=shutil.ignore_patterns("*.tmp"),
                            dirs_exist_ok=True)
    downstream_table.gather(results / DOWNSTREAM, bundle / "results" / DOWNSTREAM)
    for src in (KEPT_AFFECTED, results / AFFECTED):
        for found in sorted(src.glob("*/affected.json")):  # none where src is not a folder
            dest = bundle / "results" / AFFECTED / found.parent.name / found.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, dest)
    notice = PACKAGE_ROOT / "docs" / "downstream-notice.md"
    if notice.exists():  # its clients table rendered from the bundle's own copies; it links figures/
        (bundle / notice.name).write_text(downstream_table.render_into(notice.read_text(), bundle))
        if (notice.parent / "figures").is_dir():
            shutil.copytree(notice.parent / "figures", bundle / "figures")
    shutil.copytree(PACKAGE_ROOT / "docs" / "upstream-candidates", bundle / "upstream-candidates")
    write_pages(bundle)
    print(f"[bundle] patches/master {signoff.sign_state(bundle / 'patches' / 'master').describe()}")
    for note in github_form.write(bundle, load_manifest().by_name("master"), source.mirror_path()):
        print(f"[bundle] note: {note}")
    write_manifest(bundle)
    archive = dist / f"{bundle.name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(bundle, arcname=bundle.name)
    reused = list(status.values()).count("reused")
    print(f"[bundle] {bundle} and {archive.name}: {reused}/{len(status)} matrix cells reused, "
          f"{time.monotonic() - started:.1f} s")
    return bundle


def _bundle_files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != MANIFEST)


def manifest_inputs(bundle: Path) -> list[str]:
    """The inputs the results depend on, read from the bundle's own verdicts."""
    lines = set()
    for verdict_path in (bundle / "results").glob("*/verdict.json"):
        try:
            v = json.loads(verdict_path.read_text())
        except ValueError:  # verify reports it (validate_reports)
            continue
        src, given = v.get("source") or {}, v.get("inputs", {})
        if given.get("source"):
            kind = "checkout-commit" if src.get("upstream_commit") else f"sdist:deepspeed-{src.get('version')}"
            lines.add(f"{given['source']}  input:{kind}")
        if given.get("series") and v.get("series"):
            lines.add(f"{given['series']}  input:series:{v['series']['name']}")
        if given.get("code"):
            lines.add(f"{given['code']}  input:package-code")
    return sorted(lines)


def write_manifest(bundle: Path) -> None:
    lines = [f"{inputs.sha256_file(p)}  {p.relative_to(bundle).as_posix()}" for p in _bundle_files(bundle)]
    (bundle / MANIFEST).write_text("\n".join(lines + manifest_inputs(bundle)) + "\n")


def _noted(found_and_notes: tuple[list[str], list[str]]) -> list[str]:
    """The problems; the notes printed."""
    for note in found_and_notes[1]:
        print(f"note: {note}")
    return found_and_notes[0]


def verify(bundle: Path, repo_patches: Path | None = None) -> list[str]:
    """Every problem found, one line each; empty when the bundle is intact."""
    manifest = bundle / MANIFEST
    if not manifest.exists():
        return [f"{manifest}: missing"]
    lines = manifest.read_text().splitlines()
    listed = {
        name: digest
        for digest, _, name in (ln.partition("  ") for ln in lines) if not name.startswith("input:")
    }
    present = {p.relative_to(bundle).as_posix(): p for p in _bundle_files(bundle)}
    problems = [f"{name}: listed in {MANIFEST} but missing" for name in sorted(set(listed) - set(present))]
    problems += [f"{name}: present but not listed in {MANIFEST}" for name in sorted(set(present) - set(listed))]
    problems += [
        f"{name}: sha256 differs from {MANIFEST}" for name in sorted(set(listed) & set(present))
        if inputs.sha256_file(present[name]) != listed[name]
    ]
    if sorted(line for line in lines if "  input:" in line) != manifest_inputs(bundle):
        problems.append(f"{MANIFEST}: its input lines do not match the bundle's verdicts")
    problems += _noted(validate_reports(bundle))
    notice = bundle / "downstream-notice.md"
    if notice.exists():
        text = notice.read_text()
        problems += _rerendered(notice.name, text, lambda: downstream_table.render_into(text, bundle))
    try:
        ctx = load_context(bundle)  # one read of the results for both pages
    except ValueError:  # a report that does not validate: each page's render reads it again and says why
        ctx = None
    for name, render in PAGES.items():
        path = bundle / name
        if path.exists():
            problems += _rerendered(name, path.read_text(), lambda: render(bundle, ctx))
        else:
            problems.append(f"{name}: missing")
    problems += markdown_problems(bundle)
    if (bundle / "github").is_dir():
        problems += _noted(github_form.verify(bundle, load_manifest().by_name("master"), source.mirror_path()))
    else:
        problems.append("github/: missing (the pull request's title, body, squash message and branch)")
    if repo_patches is not None and repo_patches.is_dir():
        sender = bundle_sender(bundle)
        for p in sorted(repo_patches.rglob("*")):
            rel = p.relative_to(repo_patches).as_posix()
            twin = bundle / "patches" / rel
            # A bundle built with --sign-as carries the series re-signed: the same bytes but for the identity.
            expected = (signoff.resign_text(p.read_text(), *sender, p.name.startswith("0000-")).encode()
                        if sender and p.name.endswith(".patch") and p.parent.parent == repo_patches else None)
            if p.is_file() and (not twin.exists() or twin.read_bytes() != (expected or p.read_bytes())):
                problems.append(f"patches/{rel}: differs from the repository's patches/")
    return problems


def bundle_sender(bundle: Path) -> tuple[str, str] | None:
    """Who signed the bundle's series (``build --sign-as``); None while the package's placeholder does."""
    state = signoff.sign_state(bundle / "patches" / "master") if (bundle / "patches" / "master").is_dir() else None
    if state is None or not state.signers or state.signers[0] == signoff.placeholder():
        return None
    return signoff.parse_identity(state.signers[0])


def markdown_problems(bundle: Path) -> list[str]:
    """PR.md: within its line budget, with ``Fixes #N``, linking nothing inside the bundle; EVIDENCE.md: every
    link a file or folder of the bundle."""
    problems = []
    pr = bundle / "PR.md"
    if pr.exists():
        text = pr.read_text()
        if (n := nonblank_lines(text)) > MAX_LINES:
            problems.append(f"PR.md: {n} non-blank lines (at most {MAX_LINES})")
        if f"Fixes #{ISSUE}" not in text:
            problems.append(f"PR.md: no 'Fixes #{ISSUE}'")
        problems += [
            f"PR.md: links {t} (a pull request's body cannot link into the bundle)" for t in local_links(text)
        ]
    evidence = bundle / "EVIDENCE.md"
    if evidence.exists():
        for target in local_links(evidence.read_text()):
            if not (bundle / urllib.parse.unquote(target.split("#", 1)[0])).exists():
                problems.append(f"EVIDENCE.md: links {target}, which the bundle does not have")
    return problems


def validate_reports(bundle: Path) -> tuple[list[str], list[str]]:
    """(problems, notes): every report in the bundle read back through its model, one line per file that fails."""
    models, skipped = docs.load_models()
    known = {model.SCHEMA: model for model in models.values()}  # the name a report carries in its schema key
    problems = []
    for path in sorted(bundle.rglob("*.json")):
        rel = path.relative_to(bundle).as_posix()
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            problems.append(f"{rel}: not JSON ({err})")
            continue
        schema = data.get("schema") if isinstance(data, dict) else None
        if path.name == "verdict.json" and path.parent.parent == bundle / "results":
            model = Verdict
        elif isinstance(schema, str):
            model = known.get(schema)
        else:  # the benchmarks' kept runs predate the schema key: their file names say
            model = docs.by_file(models, path) if isinstance(data, dict) else None
        if model is None:
            continue
        try:
            model.from_dict(data)
        except ValueError as err:  # pydantic's ValidationError is one too
            problems.append(f"{rel}: not a valid {model.SCHEMA} report: {_reason(err)}")
    notes = [f"reports of a model that does not import are not validated: {why}" for why in skipped.values()]
    return problems, notes


def _reason(err: ValueError) -> str:
    """A validation error on one line: the first few fields and why."""
    if isinstance(err, ValidationError):
        errors = err.errors(include_url=False)
        parts = [f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in errors[:3]]
        return "; ".join(parts) + (f" (and {len(errors) - 3} more)" if len(errors) > 3 else "")
    return str(err).replace("\n", " ")


def _rerendered(name: str, shipped: str, render) -> list[str]:
    """The first ten lines of ``name`` that ``render()`` gives otherwise, or why the results cannot render it."""
    try:
        lines = zip_longest(shipped.splitlines(), render().splitlines(), fillvalue="<missing>")
    except ValueError as err:  # a report that does not validate (listed above)
        return [f"{name}: cannot be rendered from the results: {_reason(err)}"]
    return [
        f"{name}: line {i} says {x.strip()!r} but the results give {y.strip()!r}" for i, (x, y) in enumerate(lines, 1)
        if x != y
    ][:10]


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="zero3-sp bundle", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    build_p = sub.add_parser("build", help="run or reuse the matrix and write the bundle (default)")
    build_p.add_argument("--results", type=Path, default=PACKAGE_ROOT / "results",
                         help="the matrix cells' results, read and written (default results/)")
    build_p.add_argument("--dist", type=Path, default=PACKAGE_ROOT / "dist",
                         help="where the bundle goes (default dist/)")
    build_p.add_argument("--versions", nargs="*", default=None, help="restrict the matrix to these versions")
    build_p.add_argument("--backends", nargs="*", default=list(BACKENDS),
                         help="restrict the matrix to these backends (default: gloo nccl)")
    build_p.add_argument("--timeout", type=positive_seconds, default=600.0,
                         help="deadline per reproducer launch of a matrix cell that runs, s (default %(default)s)")
    build_p.add_argument("--no-audit", action="store_true", help="cells without the parity audit (quicker)")
    build_p.add_argument(
        "--sign-as", metavar="'NAME <EMAIL>'", default=None,
        help="sign the bundle's series off as this identity (the sender's); without it they carry "
        "the package's placeholder and the bundle says they are not ready to send")
    verify_p = sub.add_parser("verify", help="re-check a bundle's hashes, its reports and every number in its PR.md")
    verify_p.add_argument("path", nargs="?", type=Path, default=None, help="default: the newest bundle in dist/")
    verify_p.add_argument("--dist", type=Path, default=PACKAGE_ROOT / "dist",
                          help="where to look for the newest bundle (default dist/)")
    args = parser.parse_args(argv if argv is not None else (sys.argv[1:] or ["build"]))
    try:
        if args.command == "verify":
            bundle = args.path or _newest_bundle(args.dist)
            problems = verify(bundle, PACKAGE_ROOT / "patches")
            for p in problems:
                print(f"MISMATCH: {p}", file=sys.stderr)
            print(f"{bundle}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
            return int(Exit.OK if not problems else Exit.NOT_FIXED)
        cells = [
            c for c in matrix() if (not args.versions or c.version in args.versions) and c.backend in args.backends
        ]
        sign_as = signoff.parse_identity(args.sign_as) if args.sign_as else None
        bundle = build(args.results, args.dist, cells, args.timeout, audit=not args.no_audit, sign_as=sign_as)
        if bad := _cells_not_good(bundle):
            print(f"error: bundle written, but not every cell is fixed or skipped: {bad}", file=sys.stderr)
            return int(Exit.NOT_FIXED)
        return int(Exit.OK)
    except PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)


def _newest_bundle(dist: Path) -> Path:
    found = sorted((p for p in dist.glob(f"{NAME}-v*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not found:
        raise PipelineError(f"no bundle in {dist}: run `tox -e bundle` first")
    return found[-1]


def _cells_not_good(bundle: Path) -> dict[str, str]:
    """env -> outcome of each cell whose verdict is neither fixed nor skipped."""
    bad = {}
    for path in sorted((bundle / "results").glob("*/verdict.json")):
        try:
            if (outcome := Verdict.load(path).outcome) not in GOOD_OUTCOMES:
                bad[path.parent.name] = outcome
        except ValueError as err:
            raise PipelineError(f"{path}: not a valid verdict: {_reason(err)}") from err
    return bad
