"""PR.md and EVIDENCE.md: the typed context they are rendered from (``load_context``, from one bundle's files
only), and their rendering by ``patch_and_test/templates/``.

Every number and name the templates show is a field of the context; they hold the prose. Deterministic (the same
bundle renders the same bytes): that is how ``bundle verify`` checks every number.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Union

from patch_and_test import PACKAGE_ROOT
from patch_and_test.review.benchmark_reports import ReducePath
from patch_and_test.core import templating
from patch_and_test.core.series import Series, format_version, load_manifest, public_version, version_sort_key
from patch_and_test.core.checks import PytestCheck, outcome_counts
from patch_and_test.core.signoff import sign_state
from patch_and_test.core.templating import Model

from repro.harness.env import HostEnvironment
from repro.alst.report import AlstReport
from repro.audit.report import AuditReport
from repro.gradscale.report import Report
from repro.gradscale.space import REFERENCE_CONFIGS, SCRIPTS, ZERO3_CONFIGS
from patch_and_test.job.verdict import Verdict
from patch_and_test.upstream.job import ALST_FIX_ALONE, REGRESSION, AffectedVerdict, Partial
from patch_and_test.upstream.suite import BAD, SuiteComparison

Scalar = Optional[Union[str, int, float, bool]]
# The pull request's title: what users see, in the words they would search issues with.
TITLE = "Fix ZeRO-3 gradients being 1/sp too small with sequence parallelism (sequence_parallel_size > 1)"
NOT_RUN = ("GPU (the ALST test on CUDA)", "NCCL", "multi-node qgZ")  # CPU runs cannot: the Testing section says so
Counts = dict[str, int]
ISSUE = 8692
MAX_LINES = 25  # non-blank lines of PR.md: a squash commit's message, not a report
LINK = re.compile(r"\]\(([^)\s]+)\)")


class Fix(Model):
    """The master series, and how many backport series there are from which release on."""
    master: Any  # core.series.Series
    backports: int
    backports_from: Optional[str]


class RatioPair(Model):
    before: Optional[float]
    after: Optional[float]


class MatrixRow(Model):
    script: str
    config: str
    param: str
    values: list[Optional[RatioPair]]


class Cell(Model):
    """One cell of the pipeline's matrix: its label, its verdict file in the bundle, and the verdict."""
    label: str
    path: str
    verdict: Verdict


class Matrix(Model):
    cells: list[Cell]
    rows: list[MatrixRow]
    skipped: list[Cell]


class CellTests(Model):
    label: str
    tests: list[tuple[PytestCheck, str]]  # each test run, and its JUnit file in the bundle
    suites: list[SuiteComparison]
    after_dir: str


class Tests(Model):
    cells: list[CellTests]
    pre_existing: list[str]


class Reason(Model):
    """A test that did not pass both times (or a file not collected), and the trees it did so on."""
    kind: str
    subject: str
    why: str
    trees: list[str]


class AffectedTable(Model):
    trees: list[tuple[str, AffectedVerdict]]  # (tree name, its affected.json)
    reasons: list[Reason]


class Span(Model):
    lo: float
    hi: float


class AlstRow(Model):
    cell: str
    phase: str
    report: str
    deepspeed: str
    spans: list[Optional[Span]]
    pattern: str


class AuditRow(Model):
    cell: str
    phase: str
    report: str
    mode: str
    layouts: list[str]
    expect: str
    holds: bool
    counts: Counts


class KnownHit(Model):
    id: str
    doc: Optional[str]
    versions: list[str]


class Audit(Model):
    rows: list[AuditRow]
    known: list[KnownHit]


class TimingRow(Model):
    case: str
    params: Scalar
    numel_each: Scalar
    dtype: str
    ratios: list[float]
    extra: list[Scalar]


class UlpRow(Model):
    world: Scalar
    sp: Scalar
    dtype: str
    before: Optional[float]
    forms: list[Optional[float]]
    contiguous: Optional[float]
    equal: list[Optional[bool]]


class Numerics(Model):
    report: str
    recommended: str
    forms: list[str]
    impls: list[str]
    target_max_ratio: Scalar
    target_case: Scalar
    timing: list[TimingRow]
    ulp: list[UlpRow]
    conclusion: Optional[str]


class Testing(Model):
    """PR.md's Testing section: one affected-tests record (``send``'s own run, or the bundle's kept run of the
    newest-upstream tree), as commands and counts; only what ran."""
    commit: str  # the tree's commit
    tree: str  # what that tree is, in words
    environment: Optional[HostEnvironment]
    regression: str  # the regression test class, as pytest names it from the tree's tests/
    regression_without_fix: Optional[Counts]  # the test patch alone
    regression_with_fix: Optional[Counts]  # the whole series (the after run)
    alst: str
    alst_before: Optional[Counts]  # the tree's own ALST test, before the series
    alst_fix_alone: Optional[Counts]
    alst_failed_fix_alone: list[str]
    alst_with_series: Optional[Counts]
    affected: Optional[SuiteComparison]
    affected_files: list[str]  # as pytest names them from tests/
    selected: int  # test files the series can reach (more than affected_files where a run was narrowed)
    pre_existing_by_file: dict[str, tuple[int, str]]  # tests failing before and after: per file, how many, and why
    not_run: list[str]  # what a CPU machine cannot run: the open items


class Body(Model):
    """PR.md, the pull request's body: its title, its Testing section and the squash commit's sign-offs."""
    title: str
    testing: Optional[Testing]
    signers: list[str]  # "Name <email>"; none while the series carries the package's placeholder


class PrContext(Model):
    body: Body
    signoff: list[Any]  # core.signoff.SignState, one per series
    fix: Optional[Fix]
    series: list[Any]  # core.series.Series, newest first
    notice: bool  # the bundle carries downstream-notice.md
    matrix: Optional[Matrix]
    tests: Optional[Tests]
    affected: Optional[AffectedTable]
    alst: list[AlstRow]
    audit: Optional[Audit]
    numerics: Optional[Numerics]
    environment: list[tuple[HostEnvironment, list[str]]]  # each host the cells ran on, and its backends
    evidence: list[str]


# -- the loader ---------------------------------------------------------------------------------


def load_context(bundle: Path) -> PrContext:
    """Everything PR.md shows, read from the bundle's ``patches/``, ``results/`` and notice only."""
    verdicts = {p.parent.name: Verdict.load(p) for p in sorted((bundle / "results").glob("*/verdict.json"))}
    toml = bundle / "patches" / "series.toml"
    series = list(reversed(load_manifest(toml).series)) if toml.exists() else []
    affected = affected_results(bundle / "results" / "affected")
    matrix, numerics = _matrix(bundle, verdicts), _numerics(bundle)
    signoff = [sign_state(bundle / "patches" / s.name) for s in series]
    # The bundle's PR.md shows the kept run of the newest-upstream tree (``send`` renders its own run).
    newest = next((data for _, data in affected if data.graft), None)
    ready = next((list(s.signers) for s in signoff if s.series == "master" and s.ready), [])
    return PrContext(body=body_context(newest, ready), signoff=signoff, fix=_fix(series), series=series,
                     notice=(bundle / "downstream-notice.md").exists(), matrix=matrix, tests=_tests(bundle, verdicts),
                     affected=affected_context(affected) if affected else None, alst=_alst(bundle, verdicts),
                     audit=_audit(bundle, verdicts), numerics=numerics, environment=_environment(verdicts),
                     evidence=sorted(p.relative_to(bundle).as_posix() for p in (bundle / "results").rglob("*.json")))


def _by_version(verdicts: dict[str, Verdict]) -> list[tuple[str, Verdict]]:
    return sorted(
        verdicts.items(), key=lambda kv: (version_sort_key(kv[1].source.version
                                                           if kv[1].source else kv[1].env), kv[1].backend))


def rel(bundle: Path, path: str | Path) -> str:
    """A result's path inside the bundle (verdicts store the paths of the run that wrote them)."""
    parts = Path(path).parts
    if "results" in parts:
        return Path(*parts[len(parts) - 1 - parts[::-1].index("results"):]).as_posix()
    try:
        return Path(path).relative_to(bundle).as_posix()
    except ValueError:
        return Path(path).as_posix()


def cell_label(verdict: Verdict) -> str:
    m = re.search(r"ds([\d.]+)-(\w+)$", verdict.env)
    return f"{m.group(1)} {m.group(2)}" if m else verdict.env


def _counts(results: list, test_class: str, phase: str) -> Counts | None:
    """The counts of one test class's results in one phase of the comparison ("before", "after")."""
    found = {r.test: getattr(r, phase) for r in results if f"::{test_class}::" in r.test and getattr(r, phase)}
    return outcome_counts(found) if found else None


def _why(reasons: Counter) -> str:
    """One file's reasons for failing before and after, in a few words: the one reason, or the most frequent."""
    (first, n), = reasons.most_common(1)
    return first if len(reasons) == 1 else f"{len(reasons)} reasons, most often ({n}): {first}"


def body_context(record: AffectedVerdict | None, signers: list[str]) -> Body:
    """PR.md's context from one affected-tests record (None: a body without a Testing section)."""
    return Body(title=TITLE, testing=_testing(record) if record is not None and record.suite else None,
                signers=signers)


def _testing(record: AffectedVerdict) -> Testing:
    partial = {run.name: run for run in record.partial}
    results = record.suite.results  # body_context calls this only for a record with a suite

    def node(part: Partial) -> str:  # the class in its file on this tree, where a result or a partial run found it
        found = [r.test.split("::")[0] for r in results if f"::{part.test_class}::" in r.test]
        run = partial.get(part.name)
        return found[0] if found else part.node_ids(run.files if run else list(part.files[:1]))[0].split("::")[0]

    def alone(part: Partial) -> dict[str, str]:  # the class's outcomes with part of the series
        run = partial.get(part.name)
        return {t: o for t, o in (run.outcomes if run else {}).items() if f"::{part.test_class}::" in t}

    # one result per test id, sorted (suite.compare): the files in the order the affected table lists them
    pre_existing: dict[str, Counter] = {}
    for r in results:
        if r.category == "pre-existing":
            pre_existing.setdefault(r.test.split("::")[0], Counter())[r.reason or "no reason recorded"] += 1
    graft = record.graft
    tree = (f"the DeepSpeed {public_version(graft.release)} PyPI sdist's code on the tests of master "
            f"{graft.history[:12]} of {graft.history_date}, not an upstream commit"
            if graft else f"version.txt {public_version(record.version or '?')}")
    without, fix_alone = alone(REGRESSION), alone(ALST_FIX_ALONE)
    failed_alone = sorted(t.split("::")[-1] for t, o in fix_alone.items() if o in BAD)
    fixed = _counts(results, REGRESSION.test_class, "after")
    alst_before, alst_after = (_counts(results, ALST_FIX_ALONE.test_class, phase) for phase in ("before", "after"))
    files = [f.removeprefix("tests/") for f in record.suite.files]
    by_file = {f: (sum(why.values()), _why(why)) for f, why in pre_existing.items()}
    return Testing(commit=graft.commit if graft else record.base or "?", tree=tree, environment=record.environment,
                   regression=f"{node(REGRESSION)}::{REGRESSION.test_class}",
                   regression_without_fix=outcome_counts(without) if without else None, regression_with_fix=fixed,
                   alst=f"{node(ALST_FIX_ALONE)}::{ALST_FIX_ALONE.test_class}", alst_before=alst_before,
                   alst_fix_alone=outcome_counts(fix_alone) if fix_alone else None, alst_failed_fix_alone=failed_alone,
                   alst_with_series=alst_after, affected=record.suite, affected_files=files,
                   selected=len(record.selection.files) if record.selection else 0, pre_existing_by_file=by_file,
                   not_run=list(NOT_RUN))


def _fix(series: list[Series]) -> Fix | None:
    master = next((s for s in series if s.name == "master"), None)
    if master is None:
        return None
    backports = [s for s in series if s.name != "master"]
    return Fix(master=master, backports=len(backports),
               backports_from=format_version(min(s.min_version for s in backports)) if backports else None)


def affected_results(root: Path) -> list[tuple[str, AffectedVerdict]]:
    """(tree name, affected.json) under ``root``: the newest-upstream tree, master, then the newest tree first."""
    found = [(p.parent.name, AffectedVerdict.load(p)) for p in sorted(root.glob("*/affected.json"))]
    return sorted(
        found, key=lambda f:
        (f[0] != "newest-upstream", f[0] != "master", [-n for n in version_sort_key(f[1].version or "")]))


def affected_context(found: list[tuple[str, AffectedVerdict]]) -> AffectedTable:
    """Per tree: the selection's tests before and after the series, and the pre-existing failures' reasons."""
    reasons = {}
    for name, data in found:
        s = data.suite
        if not s:
            continue
        keys = [(r.category, r.test, r.reason) for r in s.results
                if r.category in ("pre-existing", "regression", "flaky")]
        keys += [("not collectable", path, why) for path, why in sorted(s.not_collectable.items())]
        for key in keys:
            reasons.setdefault(key, set()).add(name)
    ordered = sorted(reasons.items(), key=lambda kv: f"{kv[0][0]}: `{kv[0][1]}`: {kv[0][2]}")
    return AffectedTable(
        trees=found, reasons=[Reason(kind=k, subject=t, why=w, trees=sorted(names)) for (k, t, w), names in ordered])


# config label -> its place in the reproducers' own order
_ORDER = {config.label(): i for i, config in enumerate(REFERENCE_CONFIGS + ZERO3_CONFIGS)}


def _matrix(bundle: Path, verdicts: dict[str, Verdict]) -> Matrix | None:
    """The pipeline's cells: the ratios of those that ran (unpatched or patched), and those that did not."""
    pipeline = [(env, v) for env, v in _by_version(verdicts) if env.startswith("patch-and-test-ds")]
    if not pipeline:
        return None
    ran = [c for c in pipeline if c[1].before or c[1].after]
    skipped = [c for c in pipeline if not (c[1].before or c[1].after)]
    table: dict[tuple[str, str, str], dict[str, dict]] = {}  # (script, config, param) -> env -> phase -> ratio
    for env, _, phase, check, report in _checks(bundle, dict(ran), SCRIPTS, Report.load):
        for r in report.rows:  # a later check's ratio of the same row wins
            by_env = table.setdefault((check.script, r.config, r.param), {})
            by_env.setdefault(env, {"before": None, "after": None})[phase] = r.ratio
    rows = [
        MatrixRow(script=script, config=config, param=param,
                  values=[RatioPair(**row[env]) if env in row else None for env, _ in ran])
        for (script, config, param
             ), row in sorted(table.items(), key=lambda kv: (kv[0][0], _ORDER.get(kv[0][1], len(_ORDER)), kv[0][2]))
    ]

    def cells(found: list[tuple[str, Verdict]]) -> list[Cell]:
        return [Cell(label=cell_label(v), path=f"results/{env}/verdict.json", verdict=v) for env, v in found]

    return Matrix(cells=cells(ran), rows=rows, skipped=cells(skipped))


def _tests(bundle: Path, verdicts: dict[str, Verdict]) -> Tests | None:
    cells = [
        CellTests(label=cell_label(v), tests=[(t, rel(bundle, t.junit))
                                              for t in v.tests], suites=v.suites, after_dir=f"results/{env}/after")
        for env, v in _by_version(verdicts) if v.tests or v.suites
    ]
    pre_existing = sorted({t for v in verdicts.values() for s in v.suites for t in s.pre_existing})
    return Tests(cells=cells, pre_existing=pre_existing) if cells else None


def _checks(bundle: Path, verdicts: dict[str, Verdict], scripts: tuple[str, ...], load):
    """(env, verdict, phase, check, report) of every check of ``scripts`` whose report the bundle carries."""
    for env, v in _by_version(verdicts):
        for phase in ("before", "after"):
            for check in getattr(v, phase):
                path = bundle / rel(bundle, check.report) if check.script in scripts and check.report else None
                if path is not None and path.exists():
                    yield env, v, phase, check, load(path)


def _alst(bundle: Path, verdicts: dict[str, Verdict]) -> list[AlstRow]:
    """The ALST recipe reproducer, before and after, in every cell that ran it."""
    rows = []
    for _, v, phase, check, report in _checks(bundle, verdicts, ("alst_recipe", ), AlstReport.load):
        ratios: dict[tuple[str, int], list[float]] = {}
        for r in report.rows:
            ratios.setdefault((r.recipe, r.stage), []).append(r.ratio)
        spans = [ratios.get((recipe, stage)) for recipe in ("allgather", "own_share") for stage in (2, 3)]
        rows.append(
            AlstRow(cell=cell_label(v), phase=phase, report=rel(bundle, check.report), pattern=check.pattern,
                    deepspeed=report.deepspeed_version,
                    spans=[Span(lo=min(s), hi=max(s)) if s else None for s in spans]))
    return rows


def _audit(bundle: Path, verdicts: dict[str, Verdict]) -> Audit | None:
    """The parity audit's counts per cell, before and after, and the known upstream discrepancies."""
    rows, known, writeups = [], {}, {}
    for _, v, phase, check, report in _checks(bundle, verdicts, ("parity_audit", ), AuditReport.load):
        rows.append(
            AuditRow(cell=cell_label(v), phase=phase, report=rel(bundle, check.report), mode=report.mode,
                     expect=check.expect, holds=check.holds, layouts=[f"{t.sp}x{t.dp}" for t in report.topologies],
                     counts=report.summary.counts.model_dump()))
        for kid, n in report.summary.known_points.items():
            if n:
                known.setdefault(kid, set()).add(cell_label(v).split()[0])
        writeups.update({k.id: k.writeup for k in report.known})
    if not rows:
        return None
    # The write-up the audit's known list names for each entry (docs/upstream-candidates/ in the repo).
    docs = {kid: f"upstream-candidates/{Path(writeups.get(kid) or kid + '.md').name}" for kid in known}
    hits = [
        KnownHit(id=kid, doc=docs[kid] if (bundle / docs[kid]).exists() else None,
                 versions=sorted(known[kid], key=version_sort_key)) for kid in sorted(known)
    ]
    return Audit(rows=rows, known=hits)


def _numerics(bundle: Path) -> Numerics | None:
    """Cost and numerics of the reduce path (benchmarks/reduce_path.py, its report in the bundle), where it ran."""
    path = bundle / "results" / "benchmarks" / "reduce_path.json"
    if not path.exists():
        return None
    run = ReducePath.load(path)
    # The forms of the fix are named by the run; "recommended" is the master series' patch 1.
    recommended = run.recommended
    forms = [recommended] + sorted(n for n in run.patches if n != recommended)
    timing = run.timing or []
    impls = [n for n in ("before-again", *forms) if n in timing[0].wall_ratio_vs_before] if timing else []
    ulp = {(n.world, n.sp, n.dtype, n.kind, n.path): n.max_ulp for n in run.numerics or []}
    bitwise = {(b.world, b.sp, b.dtype, b.kind): b.model_extra for b in run.numerics_bitwise or []}
    ulp_rows = []
    for world, sp, dtype in sorted({k[:3] for k in ulp}):
        flags = bitwise.get((world, sp, dtype, "exact"), {})
        random_ulp = lambda path: ulp.get((world, sp, dtype, "random", path))  # noqa: E731
        ulp_rows.append(
            UlpRow(world=world, sp=sp, dtype=dtype, before=random_ulp("avg_scatter[before]"),
                   forms=[random_ulp(f"avg_scatter[{n}]") for n in forms], contiguous=random_ulp("contiguous"),
                   equal=[flags.get(f"contiguous==avg_scatter[{n}]") for n in forms]))
    return Numerics(
        report=rel(bundle, path), recommended=recommended, forms=forms, impls=impls,
        target_max_ratio=run.target.max_ratio, target_case=run.target.case, timing=[
            TimingRow(case=row.case, params=row.params, numel_each=row.numel_each, dtype=row.dtype,
                      ratios=[row.wall_ratio_vs_before[n].median_paired
                              for n in impls], extra=[getattr(row.analytic_extra_bytes_rank0, n, "-") for n in forms])
            for row in timing
        ], ulp=ulp_rows, conclusion=run.conclusion or None)


def _environment(verdicts: dict[str, Verdict]) -> list[tuple[HostEnvironment, list[str]]]:
    """The hosts the cells ran on (the versions and counts PR.md shows), each with the backends it ran."""
    envs: dict[tuple, tuple[HostEnvironment, set[str]]] = {}
    for v in verdicts.values():
        if (e := v.environment) is not None:
            envs.setdefault((e.os, e.python, e.torch, e.machine, e.cpus, e.gpus), (e, set()))[1].add(v.backend)
    return [(e, sorted(backends)) for _, (e, backends) in sorted(envs.items(), key=lambda kv: str(kv[0]))]


# -- the pages ----------------------------------------------------------------------------------


def render_body(body: Body) -> str:
    """PR.md: the pull request's title and body, squash-ready (the bundle's and ``send``'s, one template)."""
    return templating.render("PR.md.j2", body=body, issue=ISSUE)


def render_pr(bundle: Path, ctx: PrContext | None = None) -> str:
    """The bundle's PR.md (from ``ctx``, the bundle's context when the caller has it)."""
    return render_body((ctx or load_context(bundle)).body)


def render_evidence(bundle: Path, ctx: PrContext | None = None) -> str:
    """The review's evidence: every table, with links to the bundle's files (where the bundle has them)."""

    def linked(text: str, target: str) -> str:  # a file a trimmed bundle lacks is named, not linked
        return f"[{text}]({templating.link(target)})" if (bundle / target).exists() else f"{text} (`{target}`)"

    return templating.render("EVIDENCE.md.j2", ctx=ctx or load_context(bundle), issue=ISSUE, linked=linked)


def render_sending(bundle: Path, ctx: PrContext | None = None) -> str:
    """SENDING.md: what the sender settles first (#8854, the release); it shows none of the results' numbers."""
    return templating.render("SENDING.md.j2", issue=ISSUE)


# The bundle's pages, each rendered from the bundle alone: bundle build writes them, bundle verify renders them again.
PAGES = {"PR.md": render_pr, "EVIDENCE.md": render_evidence, "SENDING.md": render_sending}


def write_pages(bundle: Path) -> None:
    ctx = load_context(bundle)  # one read of the results for every page
    for name, render in PAGES.items():
        (bundle / name).write_text(render(bundle, ctx))


def nonblank_lines(markdown: str) -> int:
    return sum(1 for line in markdown.splitlines() if line.strip())


def local_links(markdown: str) -> list[str]:
    """Link targets that are files (not web addresses, not anchors)."""
    return [t for t in LINK.findall(markdown) if not re.match(r"^(https?:|mailto:|#)", t)]


KEPT = PACKAGE_ROOT / "docs" / "affected-results"
BEGIN, END = "<!-- affected-results: begin (rendered by zero3-sp docs) -->", "<!-- affected-results: end -->"


def affected_table(root: Path = KEPT) -> str:
    """docs/affected-tests.md's table (between BEGIN and END): the runs kept under ``root``."""
    return templating.render("affected_table.md.j2", table=affected_context(affected_results(root)),
                             link_root="affected-results").rstrip("\n")
