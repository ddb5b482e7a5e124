"""``zero3-sp affected run``: DeepSpeed's own tests that a series can reach, before and after it.

For a DeepSpeed checkout (only read) and any series folder, without installs or reproducers: the selected tests
on the base, again after ``git am``, and ``affected.json`` (``AffectedVerdict``).

exit codes (``errors.Exit``): OK when no test regressed, REGRESSION, ERROR (also for a run that crashed, hit its
deadline or collected fewer tests after) or SERIES_DOES_NOT_APPLY.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field, computed_field

from patch_and_test.core import series as series_mod, source as source_mod
from patch_and_test.core.checks import ended_early
from patch_and_test.core.errors import CommandParser, Exit, PipelineError
from patch_and_test.upstream import affected, suite as upstream_suite
from repro.harness.env import HostEnvironment, host_environment
from repro.harness.files import relative_to
from repro.harness.report import JsonReport

SCHEMA = "zero3-sp-gradfix/affected/v1"
AffectedOutcome = Literal["no-regression", "regression", "error", "series-does-not-apply", "skipped", "already-fixed"]


class AffectedVerdict(JsonReport):
    """``affected.json``: the selection, its tests before and after the series, one outcome and exit code."""

    SCHEMA: ClassVar[str] = SCHEMA

    source: str = Field(description="the checkout's folder name, or newest-upstream")
    series: str
    series_version: int | None = Field(None, description="series.toml's version of a patches/ series")
    version: str | None = None  # the tree's version.txt
    base: str | None = None
    head: str | None = None
    selection: affected.Selection | None = None
    only: list[str] = Field(default_factory=list, description="the selection was narrowed to these files")
    graft: source_mod.Graft | None = Field(None, description="a newest-upstream tree: the release and master commit")
    partial: list[upstream_suite.SuiteRun] = Field(
        default_factory=list,
        description="the series' own tests on part of it (PARTIALS): each must fail there to prove anything")
    environment: HostEnvironment | None = None  # absent in files written before it was recorded
    suite: upstream_suite.SuiteComparison | None = None
    error: str | None = None
    error_exit: Exit | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AffectedVerdict:
        # Files written before this model (docs/affected-results) carry no schema name.
        return super().from_dict({"schema": SCHEMA, **data})

    @computed_field(description="no-regression, regression, or as patch_and_test.core.checks.ended_early says")
    @property
    def outcome(self) -> AffectedOutcome:
        return self.decision()[0]

    @computed_field(description="the job's exit code for the outcome (patch_and_test.core.errors.Exit)")
    @property
    def exit_code(self) -> int:
        return int(self.decision()[1])

    def decision(self) -> tuple[AffectedOutcome, Exit]:
        if self.error is not None:
            return ended_early(self.error_exit)
        if self.suite is None or self.suite.status == "error":
            return "error", Exit.ERROR
        if self.suite.status == "regression":
            return "regression", Exit.REGRESSION
        return "no-regression", Exit.OK


def series_from_dir(directory: Path) -> series_mod.Series:
    """Any folder of ``git format-patch`` files, applied whole (every patch as a fix: no folder checks)."""
    patches = tuple(series_mod.Patch(p.name, p, "fix") for p in affected.numbered_patches(directory))
    if not patches:
        raise PipelineError(f"{directory} holds no numbered patches")
    return series_mod.Series(name=directory.name, version=0, min_version=(0, 0, 0), below_version=(999, 0, 0),
                             base_commit="", base_ref="", directory=directory, cover_letter=directory / "0000",
                             patches=patches)


@dataclasses.dataclass(frozen=True)
class Partial:
    """Part of a series applied alone, and the one test class it must leave failing."""

    name: str
    roles: tuple[str, ...]  # the patches applied (series.ROLES)
    files: tuple[str, ...]  # the test file, where each release line keeps it
    test_class: str
    needs: str | None = None  # a role the series must have for this run to show anything

    def node_ids(self, files: list[str]) -> list[str]:
        """The class in each file, as pytest names it from the tree's tests/ (where DeepSpeed's tests run)."""
        return [f"{f.removeprefix('tests/')}::{self.test_class}" for f in files]


# the upstream regression test: its class, and its file in each release line
REGRESSION = Partial("regression test without the fix", ("test", ),
                     ("tests/unit/v1/zero/test_zero.py", "tests/unit/runtime/zero/test_zero.py"),
                     "TestZero3SequenceParallelGradientScale")
# the companion's reason: the recipe that relied on the bug fails with the fix alone
ALST_FIX_ALONE = Partial("ALST test with the fix alone", ("fix", ),
                         ("tests/unit/ulysses_alst/test_ulysses_sp_hf.py", ), "TestUlyssesSPHF", needs="companion")
PARTIALS = (REGRESSION, ALST_FIX_ALONE)


def manifest_series(series_dir: Path) -> series_mod.Series | None:
    """The manifest's series for a folder of patches/, with its roles; None for any other folder."""
    try:
        found = series_mod.load_manifest().by_name(series_dir.name)
    except PipelineError:
        return None
    return found if found.directory.resolve() == series_dir.resolve() else None


Apply = Callable[[series_mod.Series], str]  # puts the tree at its base plus these patches; returns the head


def run_partials(tree: source_mod.SourceTree, series: series_mod.Series, results: Path, apply: Apply,
                 **kwargs) -> list[upstream_suite.SuiteRun]:
    """Each ``PARTIALS`` entry whose patches and test exist: applied alone on the base, its test class run."""
    runs = []
    for part in PARTIALS:
        patches = tuple(p for p in series.patches if p.role in part.roles)
        files = [f for f in part.files if (tree.path / f).is_file()]
        if not patches or not files or (part.needs and not any(p.role == part.needs for p in series.patches)):
            continue  # nothing to show here
        apply(dataclasses.replace(series, patches=patches))
        try:
            # The class alone (pytest FILE::CLASS from tests/): the command the pull request's body quotes.
            run = upstream_suite.run_suite(part.name, tree.path, files, results / "partial", keep=(part.test_class, ),
                                           node_ids=part.node_ids(files), **kwargs)
            # Paths from the results folder on: the record stays valid where it is kept (docs/, a bundle).
            runs.append(run.model_copy(update={k: relative_to(getattr(run, k), results) for k in ("log", "record")}))
            print(f"{part.name}: {runs[-1].counts}", flush=True)
        finally:
            series_mod.git(tree.path, "reset", "-q", "--hard", tree.base)
    return runs


def run_on_tree(verdict: AffectedVerdict, tree: source_mod.SourceTree, series: series_mod.Series, results: Path, *,
                roles: series_mod.Series | None = None, apply: Apply | None = None, depth: str = "quick",
                only: list[str] | None = None, workers: int = 0) -> None:
    """Fills ``verdict``: selection, before, ``roles``' ``PARTIALS``, ``apply`` (``git am``), after, reruns."""
    apply = apply or (lambda part: series_mod.apply_series(tree.path, part).head)
    verdict.base = series_mod.git(tree.path, "rev-parse", "HEAD").stdout.strip()
    verdict.version = tree.version
    verdict.selection = affected.select(affected.patch_changes(p.path for p in series.patches), tree.path)
    print(verdict.selection.describe(), flush=True)
    files = [f for f in verdict.selection.paths if not only or f in only]
    kwargs = dict(depth=depth, workers=workers)
    before = upstream_suite.run_suite("before", tree.path, files, results / "before", **kwargs)
    print(f"before: {before.collected} tests, {before.counts}, {before.wall_s:.0f} s", flush=True)
    if roles is not None and not only:
        verdict.partial = run_partials(tree, roles, results, apply, **kwargs)
    verdict.head = apply(series)
    after = upstream_suite.run_suite("after", tree.path, files, results / "after", **kwargs)
    print(f"after: {after.collected} tests, {after.counts}, {after.wall_s:.0f} s", flush=True)
    verdict.suite = upstream_suite.compare_after_reruns("upstream affected tests", tree.path, before, after,
                                                        results / "after", workers=workers)
    print("\n".join(verdict.suite.describe()), flush=True)


def run(src: Path | None, series_dir: Path, results: Path, *, depth: str = "quick", only: list[str] | None = None,
        workers: int = 0) -> AffectedVerdict:
    """DeepSpeed's affected tests of ``src`` (a checkout; None: the newest-upstream tree), before and after."""
    results.mkdir(parents=True, exist_ok=True)
    # Names, not this machine's paths: the base commit says which tree it was.
    name = src.resolve().name if src is not None else source_mod.NEWEST_UPSTREAM
    with_roles = manifest_series(series_dir)
    verdict = AffectedVerdict(source=name, series=series_dir.name,
                              series_version=with_roles.version if with_roles is not None else None,
                              only=list(only or []), environment=host_environment("gloo"))
    tree = None
    try:
        chosen = series_from_dir(series_dir)
        tree = (source_mod.from_newest_upstream(f"affected-{series_dir.name}")
                if src is None else source_mod.from_checkout(src, series_name=f"affected-{series_dir.name}"))
        verdict.graft = tree.graft  # None for a checkout
        run_on_tree(verdict, tree, chosen, results, roles=with_roles, depth=depth, only=only, workers=workers)
    except PipelineError as err:
        verdict.error, verdict.error_exit = str(err), int(err.exit_code)
    finally:
        if tree is not None:
            tree.release()
    verdict.write(results / "affected.json")
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="zero3-sp affected run", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--src", type=Path, help="a clean DeepSpeed checkout (only read)")
    where.add_argument(
        "--newest-upstream", action="store_true",
        help="the newest locked sdist's code on the mirror's master, with master's tests/ "
        "(deepspeed-sdists.lock [newest-upstream]; needs the mirror, DEEPSPEED_MIRROR)")
    parser.add_argument("--series", type=Path, required=True, help="a folder of git format-patch files")
    parser.add_argument("--results", type=Path, default=Path("results/affected"),
                        help="where the reports go (default %(default)s)")
    parser.add_argument(
        "--depth", choices=("quick", "full"), default="quick",
        help="quick: the selected tests that start no ranks plus the classes the fix changes; full: "
        "every selected test (hours on CPU) (default quick)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only this selected test file (tree-relative; repeatable), to check one file fast")
    parser.add_argument("--workers", type=int, default=0,
                        help="pytest-xdist workers (-n N; no --forked, see docs/affected-tests.md)")
    args = parser.parse_args(argv)
    verdict = run(args.src, args.series.resolve(), args.results.resolve(), depth=args.depth, only=args.only,
                  workers=args.workers)
    if verdict.error:
        print(f"error: {verdict.error}", file=sys.stderr)
    print(f"outcome: {verdict.outcome} (exit {verdict.exit_code}); {args.results.resolve() / 'affected.json'}")
    return verdict.exit_code
