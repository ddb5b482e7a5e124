"""``zero3-sp releases``: every DeepSpeed release on PyPI takes its series' fix.

For each release that ``pip index versions deepspeed`` lists from ``--from`` to ``--to`` (default: the
manifest's lowest version to the newest release it covers), or each ``--version``: its sdist is downloaded
(sha256 recorded, checked where ``deepspeed-sdists.lock`` pins it), made a git repository, given the series'
patches that need neither ``tests/`` nor ``docs/`` with plain ``git am``, and read by ``tree_has_fix`` before
(unfixed) and after (fixed); whether the mirror has its tag is recorded. Steps: docs/releases.md.

Writes ``docs/releases/releases.json`` and ``docs/releases.md``, rendered from it. ``zero3-sp docs`` downloads
nothing: it renders the Markdown again from the JSON and fails when a row fails or the JSON's series are no
longer those of ``patches/``.

Exit codes: 0 every row holds; 1 a row fails (a series does not apply, tree_has_fix says the
wrong thing, a listed release has no series); 2 bad input or a step could not run (a download, git).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar, Optional

from pydantic import computed_field

from patch_and_test.core import errors
from patch_and_test.core import source
from patch_and_test.core import templating
from patch_and_test.core.gitrun import git
from patch_and_test.core.inputs import sha256_file
from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.series import (Manifest, Series, SkippedPatch, apply_series, format_version, load_manifest,
                                        parse_version, series_for_version, tree_has_fix, version_sort_key)
from repro.harness.report import JsonReport, Record

SCHEMA = "zero3-sp-gradfix/releases/v1"
DEFAULT_JSON = PACKAGE_ROOT / "docs" / "releases" / "releases.json"
DEFAULT_MARKDOWN = PACKAGE_ROOT / "docs" / "releases.md"
COMMAND = "zero3-sp releases"
LISTED_BY_INDEX = "pip index versions deepspeed"
SHORT_SHA = 16  # hex digits of an sdist's sha256 in the Markdown table (the JSON has all 64)


class SeriesPatch(Record):
    file: str
    role: str
    needs: list[str]  # the tree's top-level folders the patch needs (series.ROLES): none for the code
    sha256: str  # of the patch file the table was made with


class SeriesUsed(Record):
    """A series as the table applied it: which patch files, with which content."""

    name: str
    version: int
    range: str
    patches: list[SeriesPatch]

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def sdist_patches(self) -> list[str]:  # what goes onto a PyPI sdist, which has neither tests/ nor docs/
        return [p.file for p in self.patches if not set(p.needs) & {"tests", "docs"}]


class ReleaseRow(Record):
    """One release: its sdist, its series applied to it, what tree_has_fix read before and after."""

    version: str
    sdist: str  # the archive's file name
    sha256: str
    downloaded: bool  # by this run; False: the package cache had it (its sha256 is still this run's reading)
    locked: bool  # deepspeed-sdists.lock pins this version (and the sha256 matched it)
    version_txt: str  # the sdist's own version.txt
    mirror_tag: Optional[bool]  # a tag v<version> on the mirror; None: no mirror to ask
    series: Optional[str]  # the name of the series the manifest picks; None: none covers the version
    applied: list[str]
    left_out: list[SkippedPatch]
    fixed_before: bool
    fixed_after: bool  # read after the attempt; a series that did not apply was rolled back
    error: Optional[str]  # why git am or apply_series refused: git's error line included
    seconds: float


def row_problem(row: ReleaseRow, series: SeriesUsed | None) -> str | None:
    """Why the row fails, or None when it holds: the series applied and the tree went unfixed -> fixed."""
    if row.series is None:
        return "no series in patches/series.toml covers this version"
    if series is None:
        return f"series {row.series} is not among the report's series"
    if row.fixed_before:
        return "tree_has_fix says the released sdist is already fixed"
    if row.error:
        return f"does not apply: {row.error}"
    if row.applied != series.sdist_patches:
        return (f"applied {', '.join(row.applied) or 'nothing'}, but the series' patches that need no tests/ or docs/ "
                f"are {', '.join(series.sdist_patches) or 'none'}")
    if not row.fixed_after:
        return "tree_has_fix says unfixed after the series"
    return None


class ReleasesReport(JsonReport):
    """``docs/releases/releases.json``: every release checked, with the series as they were applied."""

    SCHEMA: ClassVar[str] = SCHEMA

    command: str  # what made it; the same command makes it again
    listed_by: str  # "pip index versions deepspeed" or "--version" (the caller named them)
    version_from: Optional[str]
    version_to: Optional[str]
    listed: list[str]  # the releases to check, oldest first
    mirror_newest_tag: Optional[str]  # the newest release tag on the mirror; None: no mirror
    series: list[SeriesUsed]
    rows: list[ReleaseRow]
    python_version: str
    git_version: str
    pip_version: str
    started_at: str  # UTC, ISO 8601
    wall_time_s: float

    def series_of(self, row: ReleaseRow) -> SeriesUsed | None:
        return next((s for s in self.series if s.name == row.series), None)

    @computed_field
    @property
    def failures(self) -> dict[str, str]:
        """Version -> why its row fails; a listed release without a row fails too."""
        out = {v: "listed but not checked" for v in self.listed if v not in {r.version for r in self.rows}}
        out.update((row.version, why) for row in self.rows if (why := row_problem(row, self.series_of(row))))
        return out

    @computed_field
    @property
    def untagged(self) -> list[str]:
        """The releases with no git tag on the mirror: their sdist is their only source."""
        return [r.version for r in self.rows if r.mirror_tag is False]

    @computed_field
    @property
    def holds(self) -> bool:
        return bool(self.rows) and not self.failures

    @computed_field
    @property
    def exit_code(self) -> int:
        return 0 if self.holds else 1

    @property
    def held(self) -> int:
        return len([r for r in self.rows if r.version not in self.failures])

    def summary(self) -> str:
        line = f"{len(self.rows)} release(s) checked, {self.held} hold"
        if self.failures:
            line += "; FAIL: " + "; ".join(f"{v}: {why}" for v, why in self.failures.items())
        return line


def patch_label(file: str, series: SeriesUsed | None) -> str:
    """``0001-Scale-....patch`` -> ``0001 fix``."""
    role = next((p.role for p in series.patches if p.file == file), "?") if series else "?"
    return f"{file.split('-', 1)[0]} {role}"


def table_rows(report: ReleasesReport) -> list[dict[str, str]]:
    out = []
    failures = report.failures
    for row in report.rows:
        series = report.series_of(row)
        notes = [
            failures.get(row.version), "no git tag: PyPI is its only source" if row.mirror_tag is False else None,
            f"its version.txt says {row.version_txt}" if row.version_txt != row.version else None,
            "sha256 pinned in deepspeed-sdists.lock" if row.locked else None
        ]
        tag = {True: f"v{row.version}", False: "**none**", None: "?"}[row.mirror_tag]
        out.append(
            dict(version=f"**{row.version}**" if row.mirror_tag is False else row.version, tag=tag,
                 sha256=f"`{row.sha256[:SHORT_SHA]}`", series=series.label if series else (row.series or "none"),
                 applied=", ".join(patch_label(f, series) for f in row.applied) or "none",
                 before="unfixed" if not row.fixed_before else "**fixed**",
                 after="fixed" if row.fixed_after else "**unfixed**",
                 verdict="**FAILS**" if row.version in failures else "holds",
                 note="; ".join(filter(None, notes)).replace("|", "\\|")))
    return out


def render_markdown(report: ReleasesReport, json_link: str) -> str:
    return templating.render("releases.md.j2", report=report, rows=table_rows(report), json_link=json_link,
                             short=SHORT_SHA)


def json_link(json_path: Path, markdown_path: Path) -> str:
    return Path(os.path.relpath(json_path.resolve(), markdown_path.resolve().parent)).as_posix()


def series_used(series: Series) -> SeriesUsed:
    patches = [
        SeriesPatch(file=p.file, role=p.role, needs=list(p.needs_dirs), sha256=sha256_file(p.path))
        for p in series.patches
    ]
    return SeriesUsed(name=series.name, version=series.version, range=series.range_text, patches=patches)


def select_versions(available: list[str], low: str, high: str) -> list[str]:
    """The releases from ``low`` to ``high`` (both included), oldest first; unreadable ones skipped."""
    lo, hi = parse_version(low), parse_version(high)
    picked = [
        t for t in available
        if (version := version_sort_key(t)) and lo <= version <= hi and format_version(version) == t
    ]
    return sorted(picked, key=parse_version)


def default_range(manifest: Manifest, available: list[str]) -> tuple[str, str]:
    """The manifest's lowest version to the newest listed release it covers."""
    low, _ = manifest.bounds
    listed = select_versions(available, format_version(low), "999.0.0")
    covered = [v for v in listed if any(s.covers(parse_version(v)) for s in manifest.series)]
    if not covered:
        raise errors.BadInput(f"pip lists no DeepSpeed release that patches/series.toml covers "
                              f"({manifest.supported_range})")
    return format_version(low), covered[-1]


def mirror_release_tags(mirror: Path) -> set[str] | None:
    """The mirror's release tags (``v0.19.5``); None when there is no mirror."""
    if not mirror.exists():
        return None
    listed = git(mirror, "tag", "--list", "v*", check=False)
    if listed.returncode != 0:
        raise errors.BadInput(f"git tag --list failed on the DeepSpeed mirror: {listed.stderr.strip()[-200:]}")
    return {t for t in listed.stdout.split() if t.count(".") == 2 and t[1:].replace(".", "").isdigit()}


def check_release(version: str, manifest: Manifest, lock: dict, tags: set[str] | None) -> ReleaseRow:
    """Download, unpack, apply, read: one row. Raises BadInput when a step could not run."""
    start = time.monotonic()
    cached = source.sdist_path(version, lock).is_file()
    archive = source.fetch_sdist(version, lock, require_lock=False)
    digest = sha256_file(archive)
    try:
        series = series_for_version(version, manifest)
    except errors.UnknownVersion:
        series = None
    tree = source.from_pypi(version, lock=lock, require_lock=False)
    try:
        if source.sdist_digest(tree) != digest:
            raise errors.BadInput(f"the cached git repo of DeepSpeed {version} was made from another archive than "
                                  f"{archive.name} (sha256 {digest[:12]}); remove it from the cache's pypi/ folder")
        before = tree_has_fix(tree.path)
        applied, left_out, error = (), (), None
        if series is not None:
            try:
                result = apply_series(tree.path, series)
                applied, left_out = result.applied, result.skipped
            except (errors.SeriesDoesNotApply, errors.AlreadyFixed) as exc:
                error = str(exc).replace(str(tree.path), "the sdist repo")  # no machine path in the table
        after = tree_has_fix(tree.path)
    finally:
        tree.release()
    return ReleaseRow(version=version, sdist=archive.name, sha256=digest, downloaded=not cached, locked=version
                      in lock, version_txt=tree.version, mirror_tag=None if tags is None else f"v{version}" in tags,
                      series=series.name if series else None, applied=list(applied), left_out=list(left_out),
                      fixed_before=before, fixed_after=after, error=error, seconds=round(time.monotonic() - start, 2))


def _tool_version(cmd: list[str]) -> str:
    words = subprocess.run(cmd, capture_output=True, text=True).stdout.split()
    return next((w for w in words if w[:1].isdigit()), "unknown")


def build(versions: list[str], listed_by: str, version_from: str | None, version_to: str | None, manifest: Manifest,
          command: str) -> ReleasesReport:
    start, started_at = time.monotonic(), datetime.datetime.now(datetime.timezone.utc)
    lock, tags = source.load_lock(), mirror_release_tags(source.mirror_path())
    every_series = {s.name: series_used(s) for s in manifest.series}
    rows = []
    for version in versions:
        row = check_release(version, manifest, lock, tags)
        problem = row_problem(row, every_series.get(row.series or ""))
        print(
            f"{version}: {row.series or 'no series'}: applied {', '.join(row.applied) or 'nothing'}; "
            f"{'fixed' if row.fixed_before else 'unfixed'} -> {'fixed' if row.fixed_after else 'unfixed'}"
            f"{'' if problem is None else ' FAILS: ' + problem} ({row.seconds:.1f} s)", flush=True)
        rows.append(row)
    used = [every_series[s.name] for s in manifest.series if s.name in {r.series for r in rows}]
    git_version, pip_version = _tool_version(["git", "--version"]), _tool_version([*source.pip_command(), "--version"])
    return ReleasesReport(command=command, listed_by=listed_by, version_from=version_from, version_to=version_to,
                          listed=versions, mirror_newest_tag=max(tags, key=parse_version) if tags else None,
                          series=used, rows=rows, python_version=platform.python_version(), git_version=git_version,
                          pip_version=pip_version, started_at=started_at.isoformat(timespec="seconds"),
                          wall_time_s=round(time.monotonic() - start, 1))


def kept_markdown(markdown_path: Path, json_path: Path = DEFAULT_JSON) -> str:
    return render_markdown(ReleasesReport.load(json_path), json_link(json_path, markdown_path))


def problems(manifest: Manifest, json_path: Path = DEFAULT_JSON) -> list[str]:
    """What rendering the kept table again cannot mend: series changed in ``patches/`` since, rows that fail."""
    report = ReleasesReport.load(json_path)
    now = {s.name: series_used(s) for s in manifest.series}
    found = [
        f"series {used.label}: patches/ differ from what the table applied (rerun {COMMAND})" for used in report.series
        if now.get(used.name) != used
    ]
    return found + [f"{version}: {why}" for version, why in report.failures.items()]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = errors.CommandParser(prog=COMMAND, description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="version_from", metavar="VERSION",
                        help="oldest release to check (default: the manifest's lowest version)")
    parser.add_argument("--to", dest="version_to", metavar="VERSION",
                        help="newest release to check (default: the newest listed release the manifest covers)")
    parser.add_argument("--version", dest="versions", action="append", metavar="VERSION",
                        help="check this release (repeat; no listing: a yanked release too)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="default: docs/releases/releases.json")
    parser.add_argument("--markdown", type=Path, default=DEFAULT_MARKDOWN, help="default: docs/releases.md")
    parser.add_argument("--manifest", type=Path, default=None, help="default: patches/series.toml")
    args = parser.parse_args(argv)
    if args.versions and (args.version_from or args.version_to):
        parser.error("--version names the releases itself: no --from/--to with it")
    for text in (t for t in [args.version_from, args.version_to, *(args.versions or [])] if t is not None):
        try:
            parse_version(text)
        except errors.UnknownVersion as exc:
            parser.error(str(exc))
    try:
        manifest = load_manifest(args.manifest)
        if args.versions:
            versions = sorted({format_version(parse_version(v)) for v in args.versions}, key=parse_version)
            listed_by, low, high = "--version", None, None
        else:
            available = source.released_versions()
            low, high = default_range(manifest, available)
            low, high = args.version_from or low, args.version_to or high
            if parse_version(low) > parse_version(high):
                raise errors.BadInput(f"--from {low} is newer than --to {high}")
            versions = select_versions(available, low, high)
            if not versions:
                raise errors.BadInput(f"pip lists no DeepSpeed release from {low} to {high}")
            listed_by = LISTED_BY_INDEX
        print(f"{len(versions)} release(s): {', '.join(versions)}", flush=True)
        report = build(versions, listed_by, low, high, manifest, " ".join([COMMAND, *argv]))
    except errors.PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return errors.Exit.ERROR
    report.write(args.json)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(render_markdown(report, json_link(args.json, args.markdown)))
    print(f"{report.summary()}; {report.wall_time_s:.0f} s; wrote {args.json} and {args.markdown}")
    return report.exit_code
