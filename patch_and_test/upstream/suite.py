"""DeepSpeed's own tests that a series can reach, run before and after it, compared test by test.

The selection comes from ``affected`` (the series' diffs against the tree). ``run_suite`` runs it
with DeepSpeed's pytest from inside the tree's ``tests/`` folder (as DeepSpeed's CI does, so its
``pytest.ini`` applies), through the ``zero3_sp_record`` plugin, which picks the depth and records
every collection error and result as JSON lines. ``compare`` is pure: it classifies every test id

* ``passed``: passed before and after;
* ``pre-existing``: failed (or errored) before and after, with a one-line reason;
* ``regression``: passed before, failed or errored after, and again on every rerun;
* ``flaky``: passed before, failed after, passed on a rerun;
* ``fixed``: failed before, passed after;
* ``new``: only after (a test the series adds), passed; ``new-failed``: only after, failed
  (counted as a regression: the series' own test fails);
* ``skipped``: skipped before or after;
* ``missing``: ran before, gone after.

and gives the suite a status: ``error`` when either run crashed (pytest exit other than 0/1),
hit its deadline, collected nothing (unless the depth deselected every test of the before run),
or collected fewer tests after than before (a ``missing``
test); else ``regression`` when any test is one; else ``ok``. A test file that cannot be
collected here (a missing optional dependency) is listed with its reason, not dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from patch_and_test.core.checks import outcome_counts, run_logged
from repro.harness.report import Record

PLUGIN_DIR = Path(__file__).resolve().parent / "pytest_plugin"
PLUGIN = "zero3_sp_record"
# The quick depth: the selected tests that start no ranks, plus these classes (the upstream
# regression test, the ALST recipe's test, and the direct tests of reduce_scatter_coalesced, whose
# pre-divide master's fix changes). A full run runs every selected test.
QUICK_DEPTH_CLASSES = ("TestZero3SequenceParallelGradientScale", "TestUlyssesSPHF", "TestReduceScatterCoalesced",
                       "TestReduceScatterCoalescedTensorSmallerThanWorldSize")
# Per run of the selection: about 3x the longest measured on 2 busy cores (quick: 1959 s with op builds;
# full: hours, 230 tests that start ranks at 106-143 s each).
TIMEOUT = {"quick": 6000.0, "full": 12 * 3600.0}
RERUNS = 2  # a passed-before / failed-after test runs this many more times before it is a regression
BAD = ("failed", "error")


class SuiteRun(Record):
    """One pytest run of the selection on one tree."""

    name: str  # e.g. "before"
    depth: str
    files: list[str]  # relative to the tree
    exit_code: int
    timed_out: bool
    wall_s: float
    outcomes: dict[str, str]  # test id -> passed | failed | error | skipped
    messages: dict[str, str]  # test id -> one-line reason (failed, error, skipped)
    not_collectable: dict[str, str]  # test file -> one-line reason
    ranks: dict[str, bool]  # test id -> it starts its own ranks (a DistributedTest)
    deselected: int  # dropped by the depth
    log: str
    record: str
    workers: int = 0  # pytest-xdist workers (0: none)

    @property
    def collected(self) -> int:
        return len(self.outcomes)

    @property
    def counts(self) -> dict[str, int]:
        return outcome_counts(self.outcomes)

    @property
    def crashed(self) -> bool:
        return self.timed_out or self.exit_code not in (0, 1)


class TestResult(Record):
    test: str
    before: str | None  # None: not there
    after: str | None
    category: str  # see the module docstring
    reason: str = ""  # the failure's one-line message (pre-existing, regression, flaky, new-failed)
    reruns: tuple[str, ...] = ()


class SuiteComparison(Record):
    """The selection before and after the series: the suite's status and every test's category."""

    name: str
    depth: str
    files: list[str]
    before: dict[str, int]  # counts
    after: dict[str, int]
    status: str  # ok | regression | error
    errors: list[str]  # why the status is error
    results: list[TestResult]
    regressions: list[str]  # ids; passed before, failed after on every rerun (plus new-failed)
    fixed: list[str]
    pre_existing: list[str]
    flaky: list[str]
    not_collectable: dict[str, str]
    collected_before: int = 0
    collected_after: int = 0
    wall_s_before: float = 0.0
    wall_s_after: float = 0.0
    deselected_by_depth: int = 0

    @property
    def new(self) -> list[str]:
        """The tests only the after run has (the series adds them), passed."""
        return [r.test for r in self.results if r.category == "new"]

    def describe(self) -> list[str]:
        lines = [
            f"{self.name} [{self.depth}]: {self.status}: {len(self.files)} files, {self.collected_before} tests "
            f"before / {self.collected_after} after ({self.wall_s_before:.0f} s / {self.wall_s_after:.0f} s); "
            f"{len(self.regressions)} regressions, {len(self.fixed)} fixed, {len(self.pre_existing)} "
            f"pre-existing, {len(self.flaky)} flaky"
        ]
        lines += [f"  error: {e}" for e in self.errors]
        lines += [
            f"  regression: {r.test}: {r.reason}" for r in self.results if r.category in ("regression", "new-failed")
        ]
        lines += [f"  flaky: {r.test}: {r.reason}" for r in self.results if r.category == "flaky"]
        lines += [f"  pre-existing: {r.test}: {r.reason}" for r in self.results if r.category == "pre-existing"]
        lines += [f"  not collectable: {f}: {why}" for f, why in sorted(self.not_collectable.items())]
        return lines


def read_record(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, bool], int]:
    """Outcomes, messages, not-collectable files, rank-ness and the depth's deselected count from a record."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    broken: dict[str, str] = {}
    ranks: dict[str, bool] = {}
    deselected: set[str] = set()
    if not path.exists():
        return outcomes, messages, broken, ranks, 0
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill at the deadline
        kind = e.get("kind")
        if kind in ("collect-error", "collect-skip"):
            broken[e["path"]] = ("skipped at collection: " if kind == "collect-skip" else "") + (e["message"]
                                                                                                 or "no reason given")
        elif kind == "collected":
            ranks[e["nodeid"]] = e["ranks"]
        elif kind == "deselected":
            deselected.add(e["nodeid"])
        elif kind == "report":
            _merge(outcomes, messages, e)
    return outcomes, messages, broken, ranks, len(deselected)


def _merge(outcomes: dict[str, str], messages: dict[str, str], e: dict) -> None:
    """One setup/call/teardown report into the test's outcome: the worst phase decides."""
    test, when, outcome = e["nodeid"], e["when"], e["outcome"]
    if outcome == "failed":
        new = "failed" if when == "call" else "error"
    elif outcome == "skipped":
        new = "skipped"
    else:
        new = "passed"
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    if test not in outcomes or rank[new] > rank[outcomes[test]]:
        outcomes[test] = new
        if e.get("message"):
            messages[test] = e["message"]


def compare(name: str, before: SuiteRun, after: SuiteRun,
            reruns: dict[str, list[str]] | None = None) -> SuiteComparison:
    """Every test id's category and the suite's status (see the module docstring). Pure."""
    reruns = reruns or {}
    results = []
    for test in sorted(set(before.outcomes) | set(after.outcomes)):
        b, a = before.outcomes.get(test), after.outcomes.get(test)
        reason = after.messages.get(test) or before.messages.get(test, "")
        again = tuple(reruns.get(test, ()))
        if a is None:
            category = "missing"
        elif b is None:
            category = "new-failed" if a in BAD else ("skipped" if a == "skipped" else "new")
        elif "skipped" in (a, b):
            category = "skipped"
        elif b == "passed" and a == "passed":
            category, reason = "passed", ""
        elif b in BAD and a in BAD:
            category = "pre-existing"
        elif b in BAD:
            category, reason = "fixed", ""
        else:  # passed before, failed after
            category = "flaky" if "passed" in again else "regression"
        results.append(TestResult(test=test, before=b, after=a, category=category, reason=reason, reruns=again))

    errors = []
    for run in (before, after):
        if run.timed_out:
            errors.append(f"the {run.name} run hit its deadline ({run.wall_s:.0f} s)")
        elif run is before and run.exit_code == 5 and run.deselected and not run.not_collectable:
            # The depth left nothing of the before run (every selected test starts ranks, and the
            # series' own tests are not there yet): not a crash.
            continue
        elif run.exit_code not in (0, 1):
            errors.append(f"the {run.name} run ended with pytest exit {run.exit_code}"
                          f"{' (no tests collected)' if run.exit_code == 5 else ''}; see {run.log}")
    if not after.outcomes:
        errors.append("the after run recorded no test")
    if after.collected < before.collected:
        errors.append(f"fewer tests after than before ({after.collected} < {before.collected})")
    missing = [r.test for r in results if r.category == "missing"]
    if missing:
        errors.append(f"{len(missing)} tests ran before and not after (first: {missing[0]})")
    newly_broken = sorted(set(after.not_collectable) - set(before.not_collectable))
    for f in newly_broken:
        errors.append(f"{f} cannot be collected after the series: {after.not_collectable[f]}")

    regressions = [r.test for r in results if r.category in ("regression", "new-failed")]
    status = "error" if errors else ("regression" if regressions else "ok")
    by = lambda cat: [r.test for r in results if r.category == cat]  # noqa: E731
    return SuiteComparison(name=name, depth=after.depth, files=after.files, before=before.counts, after=after.counts,
                           status=status, errors=errors, results=results, regressions=regressions, fixed=by("fixed"),
                           pre_existing=by("pre-existing"), flaky=by("flaky"), not_collectable={
                               **before.not_collectable,
                               **after.not_collectable
                           }, collected_before=before.collected, collected_after=after.collected,
                           wall_s_before=before.wall_s, wall_s_after=after.wall_s,
                           deselected_by_depth=after.deselected)


def rerun_candidates(before: SuiteRun, after: SuiteRun) -> list[str]:
    """The tests that passed before and failed after: each runs again before it is called a regression."""
    return sorted(t for t, a in after.outcomes.items() if a in BAD and before.outcomes.get(t) == "passed")


def pytest_env(tree: Path) -> dict[str, str]:
    """DeepSpeed's way to run its unit tests on CPU from a checkout, plus our recording plugin.

    The CPU comm op that every DeepSpeed init JIT-builds goes to a folder of this tree's own (one
    the caller set wins): built once, and never into a folder another job builds into at once.
    """
    from patch_and_test.core.source import cache_dir

    ext = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        cache_dir() / "torch-ext" / f"tree-{hashlib.sha1(str(tree.resolve()).encode()).hexdigest()[:12]}")
    return {
        "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), str(tree), str(tree / "tests")]),
        "DS_ACCELERATOR": "cpu",
        # The device count DistributedTest checks on CPU: with 2 it skips the regression test's 4-rank
        # layout (sp 2 x dp 2); 4 lets 2- and 4-rank tests run on any host.
        "LOCAL_SIZE": "4",
        "TORCH_EXTENSIONS_DIR": ext
    }


def hub_env() -> dict[str, str]:
    """An offline Hugging Face hub that serves the one model DeepSpeed's ALST test loads.

    ``TestUlyssesSPHF`` calls ``from_pretrained('hf-internal-testing/tiny-random-LlamaForCausalLM')``;
    with no network that fails the same way before and after, which proves nothing. The package's
    tiny Llama is laid out in a hub cache under that repo id (``repro.alst.tiny_llama``), and the hub
    client reads only the cache. Without transformers in this interpreter the test cannot run
    anyway: no variables then, and its failure is reported with its reason.
    """
    from patch_and_test.core.source import cache_dir
    from repro.alst import tiny_llama

    hf_home = cache_dir() / "hf-home"
    try:
        tiny_llama.populate_hub_cache(hf_home)
    except tiny_llama.TransformersMissing:
        return {}
    return tiny_llama.offline_env(hf_home)


def _in_tests(path: str) -> str:
    """A tree-relative test path or node id as seen from inside ``tests/`` (where pytest runs)."""
    return path[len("tests/"):] if path.startswith("tests/") else path


def run_suite(name: str, tree: Path, files: list[str], out_dir: Path, *, depth: str = "full", keep: tuple[str,
                                                                                                          ...] = (),
              timeout: float = 3600, workers: int = 0, node_ids: list[str] | None = None) -> SuiteRun:
    """Run ``files`` (or just ``node_ids``) of DeepSpeed's tests in ``tree``; never raises on test failures."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = name.replace("/", "_").replace(" ", "_")
    record, log = out_dir / f"{slug}.jsonl", out_dir / f"{slug}.log"
    record.unlink(missing_ok=True)
    present = [f for f in files if (tree / f).is_file()]
    targets = node_ids if node_ids is not None else [_in_tests(f) for f in present]
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, f"--zero3-sp-record={record}",
        f"--zero3-sp-depth={depth}", *[f"--zero3-sp-keep={k}" for k in keep], "--continue-on-collection-errors",
        "-rfE", *(["-n", str(workers)] if workers else []), *targets
    ]
    if not targets:  # pytest's "no tests collected", without starting it; the record stays absent (empty)
        log.write_text("nothing to run\n")
        code, wall = 5, 0.0
    else:
        _drop_bytecode(tree)
        code, wall = run_logged(cmd, log, timeout=timeout, cwd=tree / "tests", env={
            **os.environ,
            **pytest_env(tree),
            **hub_env()
        })
    outcomes, messages, broken, ranks, deselected = read_record(record)
    return SuiteRun(name=name, depth=depth, files=files, log=str(log), record=str(record), workers=workers,
                    exit_code=code, timed_out=wall > 0 and wall >= timeout, wall_s=wall, outcomes=outcomes,
                    messages=messages, not_collectable=broken, ranks=ranks, deselected=deselected)


def run_at_depth(name: str, tree: Path, files: list[str], out_dir: Path, *, depth: str, workers: int,
                 keep: tuple[str, ...] = QUICK_DEPTH_CLASSES) -> SuiteRun:
    """``files`` of the selection in ``depth``, with the depth's deadline (the jobs' before and after runs)."""
    return run_suite(name, tree, files, out_dir, depth=depth, keep=keep, timeout=TIMEOUT[depth], workers=workers)


def compare_after_reruns(name: str, tree: Path, before: SuiteRun, after: SuiteRun, out_dir: Path, *,
                         workers: int) -> SuiteComparison:
    """Every passed-before/failed-after test rerun (``RERUNS`` times), then the two runs compared."""
    reruns = rerun(tree, rerun_candidates(before, after), out_dir, workers=workers)
    return compare(name, before, after, reruns)


def _drop_bytecode(tree: Path) -> None:
    """Remove the tree's compiled bytecode before a run.

    Python trusts a .pyc while its source has the recorded mtime (whole seconds) and size. A change
    that keeps the size, made in the same second as the run before it, would otherwise run the old
    code. The tree is the job's own working copy, and git ignores __pycache__.
    """
    for cache in sorted(tree.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)


def rerun(tree: Path, tests: list[str], out_dir: Path, *, times: int = RERUNS, timeout: float = 1800,
          workers: int = 0) -> dict[str, list[str]]:
    """Each test's outcomes on ``times`` more runs (all of them in one pytest run per round)."""
    seen: dict[str, list[str]] = {t: [] for t in tests}
    for i in range(times if tests else 0):
        run = run_suite(f"rerun-{i + 1}", tree, [], out_dir, timeout=timeout, workers=workers, node_ids=list(tests))
        for t in tests:
            seen[t].append(run.outcomes.get(t, "error"))
    return seen
