"""patch-and-test: source -> apply series -> install unpatched -> before -> install patched -> after -> verdict.

Each step (CONTRIBUTING.md, "The main job") appends to the verdict, written to ``results/<env>/`` whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import checks, inputs, install, series as series_mod, source as source_mod
from patch_and_test.core.errors import BadInput, Exit, PipelineError, Skipped
from patch_and_test.core.templating import counts
from patch_and_test.downstream import clients as client_check
from patch_and_test.job.verdict import Step, Verdict, summary_table
from patch_and_test.upstream import affected, suite as upstream_suite
from patch_and_test.upstream.job import REGRESSION
from repro.harness.cli import gpu_count
from repro.harness.env import host_environment

WORLD_SIZE = 2  # the reproducers' default launch: sp=2, dp=1
AUDIT_TIMEOUT_FACTOR = 3  # the job's audit is two launches of many engines each: minutes on shared cores
AFFECTED_SUITE = "upstream affected tests"
TWIN_TEST = "tests/multiprocess/test_zero3_sp_gradient_scale.py"


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    env_name: str
    results: Path
    version: str | None = None  # a PyPI release; None: the newest supported
    src: Path | None = None  # a DeepSpeed checkout (DEEPSPEED_SRC): used instead of PyPI
    newest_upstream: bool = False  # the newest locked sdist grafted onto the mirror's master: the PR series
    backend: str = "gloo"
    timeout: float = 600.0  # per reproducer launch
    upstream_suites: bool = True  # where the source has tests/: run DeepSpeed's own tests too
    upstream_depth: str = "quick"  # "quick" | "full": which of the affected tests run before and after
    upstream_workers: int = 0  # pytest-xdist workers for them (0: one process, as measured on 2 cores)
    audit: bool = True  # the parity audit (quick mode) before and after, beside the two reproducers


class _Run:
    """One pipeline run: the verdict being filled in, and where its files go."""

    def __init__(self, cfg: PipelineConfig):
        self.cfg, self.out = cfg, cfg.results
        # A draft, filled in step by step and validated (decided) once, when the run ends.
        self.verdict = Verdict.model_construct(env=cfg.env_name, source=None, series=None, deepspeed_before=None,
                                               deepspeed_after=None, backend=cfg.backend, steps=[], before=[],
                                               after=[], tests=[], suites=[],
                                               environment=host_environment(cfg.backend))
        self.tree: source_mod.SourceTree | None = None  # held (locked) until the run ends

    def step(self, name: str, status: str, detail: str, started: float, log: Path | None = None) -> None:
        self.verdict.steps.append(
            Step(name=name, status=status, detail=detail, duration_s=round(time.monotonic() - started, 3),
                 log=str(log) if log else None))
        print(f"[{self.cfg.env_name}] {name}: {status}: {detail}", flush=True)


def run(cfg: PipelineConfig) -> Verdict:
    cfg.results.mkdir(parents=True, exist_ok=True)
    r = _Run(cfg)
    started = time.monotonic()
    try:
        _run_steps(r)
    except PipelineError as err:
        # Recorded, not printed: the CLI prints it as its one-line error.
        r.verdict.error, r.verdict.error_exit = str(err), int(err.exit_code)
        r.verdict.steps.append(
            Step(name="error", status="skipped" if err.exit_code == Exit.SKIPPED else "error", detail=str(err)))
    finally:
        if r.tree is not None:
            r.tree.release()  # the working copy is free for the next job
    r.verdict.wall_time_s = round(time.monotonic() - started, 3)
    verdict = Verdict.from_draft(r.verdict)
    verdict.write(cfg.results / "verdict.json")
    if verdict.before or verdict.after or verdict.tests:
        print(summary_table(verdict), flush=True)
    return verdict


def _run_steps(r: _Run) -> None:
    cfg = r.cfg
    version = None if cfg.src or cfg.newest_upstream else (cfg.version or source_mod.newest_locked())
    if version is not None:
        # Known before any download: a skipped cell is still tied to the inputs it would have used.
        r.verdict.inputs = inputs.run_inputs(
            series_mod.series_for_version(version).directory, _sdist_sha256(version), cfg.backend, cfg.audit)
    _check_alst_pin(version)
    if cfg.backend == "nccl" and gpu_count() < WORLD_SIZE:
        raise Skipped(f"nccl needs one GPU per rank: {WORLD_SIZE} ranks, {gpu_count()} GPU(s) visible")

    t = time.monotonic()
    tree = r.tree = (source_mod.from_newest_upstream() if cfg.newest_upstream else
                     source_mod.from_checkout(cfg.src) if cfg.src else source_mod.from_pypi(version))
    r.verdict.source = tree.record()
    made_of = (f" = {tree.graft.release} sdist on master {tree.graft.history[:12]} ({tree.graft.history_date})"
               if tree.graft else "")
    r.step("source", "ok", f"DeepSpeed {tree.version} ({tree.origin}{made_of}) at {tree.path}", t)

    if version is None:  # a checkout or the graft: its version is known only now
        _check_alst_pin(tree.version)
    chosen = (series_mod.load_manifest().by_name(tree.series_name)
              if tree.series_name else series_mod.series_for_tree(tree.path))
    r.verdict.series = chosen.record()
    # What these results depend on, so a later bundle can tell whether they are still current.
    r.verdict.inputs = inputs.run_inputs(chosen.directory, tree.upstream_commit or _sdist_sha256(tree.version),
                                         cfg.backend, cfg.audit)
    r.verdict.already_fixed = series_mod.tree_has_fix(tree.path)

    # The series goes on first (one that does not apply ends the run before any build); unpatched is the base commit.
    t = time.monotonic()
    base = "HEAD"
    if r.verdict.already_fixed:
        r.step("apply series", "skipped", f"already fixed: {tree.path} carries the fix; nothing to apply", t)
    else:
        applied = series_mod.apply_series(tree.path, chosen)
        base = applied.base
        r.verdict.series = applied
        r.step("apply series", "ok", applied.summary().replace("\n", "; "), t)

    t = time.monotonic()
    before = install.install_tree(tree.path, cfg.results / "install-before.log", rev=base)
    r.verdict.deepspeed_before = before.version
    r.step("install unpatched", "ok", _installed(before), t, cfg.results / "install-before.log")

    suite_before = selection = None
    if not r.verdict.already_fixed:
        _reproducers(r, tree.version, "buggy", "before")
        if tree.has_tests and cfg.upstream_suites:
            # DeepSpeed's tests import deepspeed from the tree itself: run them on the base commit.
            with _checked_out(tree.path, base):
                selection = _affected_selection(r, tree.path, chosen.directory)
                suite_before = _affected_run(r, tree.path, selection, "before")

    t = time.monotonic()
    after = install.install_tree(tree.path, cfg.results / "install-after.log")
    r.verdict.deepspeed_after = after.version
    r.step("install patched", "ok", _installed(after), t, cfg.results / "install-after.log")

    _reproducers(r, tree.version, "fixed", "after")
    _clients(r)
    _after_test(r, "twin TestZero3SequenceParallelGradientScale", "twin of the upstream test",
                ["--run-twin", TWIN_TEST], PACKAGE_ROOT)
    if tree.has_tests:
        zero_test = next((tree.path / f for f in REGRESSION.files if (tree.path / f).is_file()), None)
        if zero_test is None:
            raise PipelineError(f"{tree.path} has tests/ but no ZeRO test file where DeepSpeed keeps it")
        name = f"upstream {REGRESSION.test_class}"
        _after_test(r, name, name, [str(zero_test), "-k", REGRESSION.test_class], tree.path,
                    upstream_suite.pytest_env(tree.path))
        if suite_before is not None and selection is not None:
            _affected_compare(r, tree.path, selection, suite_before)


def _installed(done: install.Installed) -> str:
    return f"deepspeed {done.version} ({'cached wheel' if done.cached_wheel else 'built'}, {done.installer})"


def _check_alst_pin(version: str | None) -> None:
    """A wrong transformers for the ALST steps is bad input, said before anything is downloaded or built."""
    if version is not None and checks.alst_unavailable(version) is None and (problem := checks.alst_pin_problem()):
        raise BadInput(problem)


def _reproducers(r: _Run, version: str, expect: str, phase: str) -> None:
    """The reproducers, the audit (unless --no-audit) and ALST where it can run; else its skip, recorded once."""
    scripts = checks.REPRODUCERS + ((checks.AUDIT, ) if r.cfg.audit else ())
    why_not = checks.alst_unavailable(version)
    if why_not is not None and not any(step.name == checks.ALST for step in r.verdict.steps):
        r.step(checks.ALST, "skipped", why_not, time.monotonic())
    for script in scripts + ((checks.ALST, ) if why_not is None else ()):
        _reproducer(r, script, expect, phase)


@contextlib.contextmanager
def _checked_out(tree: Path, rev: str):
    """Our own copy of the source at ``rev`` for a while, then back on its branch."""
    branch = series_mod.git(tree, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
    if rev == "HEAD" or not branch:
        yield
        return
    series_mod.git(tree, "checkout", "-q", "--detach", rev)
    try:
        yield
    finally:
        series_mod.git(tree, "checkout", "-q", branch)


def _reproducer(r: _Run, script: str, expect: str, phase: str) -> None:
    t = time.monotonic()
    # The audit's --timeout bounds all its launches.
    timeout = r.cfg.timeout * (AUDIT_TIMEOUT_FACTOR if script == checks.AUDIT else 1)
    check = checks.run_reproducer(script, expect, r.out / phase, phase, backend=r.cfg.backend, timeout=timeout)
    (r.verdict.before if phase == "before" else r.verdict.after).append(check)
    status = "ok" if check.holds else ("skipped" if check.exit_code == Exit.SKIPPED else "failed")
    r.step(f"{phase}: {script} --expect {expect}", status, f"exit {check.exit_code}, pattern {check.pattern}", t,
           Path(check.log))


def _clients(r: _Run) -> None:
    """The clients installed beside the patched build that the downstream rule says mis-scale: warned, recorded."""
    t = time.monotonic()
    warnings, error, log = client_check.run_check(r.out / "after")
    r.verdict.client_warnings = warnings
    for w in warnings:
        print(f"[{r.cfg.env_name}] WARNING: {w.message}", flush=True)
    detail = error or (f"{len(warnings)} mis-scaled client combination(s)" if warnings else "none known to mis-scale")
    r.step("after: downstream clients", "error" if error else "warning" if warnings else "ok", detail, t, log)


def _after_test(r: _Run, name: str, step: str, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    """A pytest run after the series (the twin, the upstream regression test), recorded in ``tests``."""
    t = time.monotonic()
    test = checks.run_pytest(name, args, r.out / "after", cwd=cwd, env=env)
    r.verdict.tests.append(test)
    r.step(f"after: {step}", "ok" if test.exit_code == 0 else "failed",
           counts(test.counts, f"nothing ran (exit {test.exit_code})"), t, Path(test.log))


def _affected_selection(r: _Run, tree: Path, series_dir: Path) -> affected.Selection:
    t = time.monotonic()
    selection = affected.select_for_series(series_dir, tree)
    r.verdict.affected = selection
    log = r.out / "affected-tests.txt"
    log.write_text(selection.describe() + "\n")
    print(selection.describe(), flush=True)
    r.step("affected tests", "ok", f"{len(selection.files)} of {selection.test_files_scanned} test files", t, log)
    return selection


def _affected_run(r: _Run, tree: Path, selection: affected.Selection, phase: str) -> upstream_suite.SuiteRun:
    t = time.monotonic()
    run = upstream_suite.run_suite(phase, tree, selection.paths, r.out / phase / "affected",
                                   depth=r.cfg.upstream_depth, workers=r.cfg.upstream_workers)
    r.step(
        f"{phase}: {AFFECTED_SUITE} [{r.cfg.upstream_depth}]", "error" if run.crashed else "ok",
        f"{run.collected} tests ({counts(run.counts, 'none ran')}; {run.deselected} left to the full depth), "
        f"{len(run.not_collectable)} files not collectable, pytest exit {run.exit_code}"
        f"{', deadline hit' if run.timed_out else ''}", t, Path(run.log))
    return run


def _affected_compare(r: _Run, tree: Path, selection: affected.Selection, before: upstream_suite.SuiteRun) -> None:
    after = _affected_run(r, tree, selection, "after")
    t = time.monotonic()
    comparison = upstream_suite.compare_after_reruns(AFFECTED_SUITE, tree, before, after, r.out / "after" / "affected",
                                                     workers=r.cfg.upstream_workers)
    if rerun := [x for x in comparison.results if x.reruns]:
        r.step("after: rerun passed-before/failed-after tests", "ok",
               f"{len(rerun)} tests, {upstream_suite.RERUNS} times each", t)
    r.verdict.suites.append(comparison)
    regressions = [f"regression {x}" for x in comparison.regressions]
    detail = "; ".join(comparison.describe()[:1] + comparison.errors + regressions)
    status = {"ok": "ok", "regression": "failed"}.get(comparison.status, "error")
    r.step(f"after: {AFFECTED_SUITE} before/after", status, detail, t)


def _sdist_sha256(version: str) -> str | None:
    entry = source_mod.load_lock().get(version)
    return entry.sha256 if entry else None
