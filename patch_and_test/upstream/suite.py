"""DeepSpeed's own tests that a series can reach, run before and after it, compared test by test.

``run_suite`` runs the selection (``affected``) through the ``zero3_sp_record`` plugin; ``compare`` (pure) gives
each test its category and the suite its status (the table in docs/affected-tests.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from patch_and_test.core.checks import outcome_counts, run_logged
from repro.harness.env import cache_root
from repro.harness.report import Record

PLUGIN_DIR = Path(__file__).resolve().parent / "pytest_plugin"
PLUGIN = "zero3_sp_record"
# The classes the quick depth keeps besides the tests that start no ranks (docs/affected-tests.md).
QUICK_DEPTH_CLASSES = ("TestZero3SequenceParallelGradientScale", "TestUlyssesSPHF", "TestReduceScatterCoalesced",
                       "TestReduceScatterCoalescedTensorSmallerThanWorldSize")
# Per run of the selection: about 3x the longest measured (docs/code/patch-and-test-review-upstream.md).
TIMEOUT = {"quick": 6000.0, "full": 12 * 3600.0}
RERUNS = 2  # a passed-before / failed-after test runs this many more times before it is a regression
BAD = ("failed", "error")
_WORSE = ("passed", "skipped", "failed", "error")  # a test's outcome: its worst phase's


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
    category: str  # docs/affected-tests.md
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
        for label, categories in (("regression", ("regression", "new-failed")), ("flaky", ("flaky", )),
                                  ("pre-existing", ("pre-existing", ))):
            lines += [f"  {label}: {r.test}: {r.reason}" for r in self.results if r.category in categories]
        lines += [f"  not collectable: {f}: {why}" for f, why in sorted(self.not_collectable.items())]
        return lines


def read_record(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, bool], int]:
    """Outcomes, messages, not-collectable files, rank-ness and the depth's deselected count from a report log."""
    outcomes, messages, broken, ranks = {}, {}, {}, {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill at the deadline
        kind, test = e.get("$report_type"), e.get("nodeid", "")
        if kind == "CollectReport" and test.endswith(".py") and e["outcome"] != "passed":
            why = _one_line(e["longrepr"]) or "no reason given"
            broken[test] = f"skipped at collection: {why}" if e["outcome"] == "skipped" else why
        elif kind == "TestReport":
            ranks[test] = dict(e.get("user_properties", [])).get("ranks", False)
            outcome = e["outcome"] if "wasxfail" not in e else "skipped" if e["outcome"] == "skipped" else "failed"
            # One setup/call/teardown report into the test's outcome: the worst phase decides.
            new = {"failed": "failed" if e["when"] == "call" else "error", "skipped": "skipped"}.get(outcome, "passed")
            if test not in outcomes or _WORSE.index(new) > _WORSE.index(outcomes[test]):
                outcomes[test] = new
                if new != "passed" and (message := _one_line(e["longrepr"])):
                    messages[test] = message
    deselected = path.with_suffix(".deselected")
    return outcomes, messages, broken, ranks, len(set(deselected.read_text().split()) if deselected.exists() else ())


def _one_line(longrepr) -> str:
    """A report's reason in one line: a skip's reason, a crash's message, else a traceback's error line."""
    if isinstance(longrepr, list) and len(longrepr) == 3:  # a skip: (file, line, reason)
        return (str(longrepr[2]).strip().splitlines() or [""])[0]
    crash = longrepr.get("reprcrash") if isinstance(longrepr, dict) else None
    text = crash["message"] if crash and crash.get("message") else str(longrepr or "")
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # The error line of a traceback ("E   ModuleNotFoundError: ...") says the most.
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors or lines or [""])[0][:300]


def compare(name: str, before: SuiteRun, after: SuiteRun,
            reruns: dict[str, list[str]] | None = None) -> SuiteComparison:
    """Every test id's category and the suite's status (docs/affected-tests.md). Pure."""
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
            continue  # the depth left nothing of the before run (the series' own tests are not there yet)
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
    for f in sorted(set(after.not_collectable) - set(before.not_collectable)):
        errors.append(f"{f} cannot be collected after the series: {after.not_collectable[f]}")

    regressions = [r.test for r in results if r.category in ("regression", "new-failed")]
    status = "error" if errors else ("regression" if regressions else "ok")
    by = lambda cat: [r.test for r in results if r.category == cat]  # noqa: E731
    return SuiteComparison(name=name, depth=after.depth, files=after.files, before=before.counts, after=after.counts,
                           status=status, errors=errors, results=results, regressions=regressions, fixed=by("fixed"),
                           pre_existing=by("pre-existing"), flaky=by("flaky"),
                           not_collectable=before.not_collectable | after.not_collectable,
                           collected_before=before.collected, collected_after=after.collected,
                           wall_s_before=before.wall_s, wall_s_after=after.wall_s,
                           deselected_by_depth=after.deselected)


def rerun_candidates(before: SuiteRun, after: SuiteRun) -> list[str]:
    """The tests that passed before and failed after: each runs again before it is called a regression."""
    return sorted(t for t, a in after.outcomes.items() if a in BAD and before.outcomes.get(t) == "passed")


def pytest_env(tree: Path) -> dict[str, str]:
    """DeepSpeed's way to run its unit tests on CPU from a checkout, plus our recording plugin."""
    ext = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        cache_root() / "torch-ext" / f"tree-{hashlib.sha1(str(tree.resolve()).encode()).hexdigest()[:12]}")
    return {
        "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), str(tree), str(tree / "tests")]),
        "DS_ACCELERATOR": "cpu",
        "LOCAL_SIZE": "4",  # DistributedTest's device count on CPU: 2 would skip the 4-rank (sp 2 x dp 2) layout
        "TORCH_EXTENSIONS_DIR": ext
    }


def hub_env() -> dict[str, str]:
    """An offline Hugging Face hub serving the one model DeepSpeed's ALST test loads (none without transformers)."""
    from repro.alst import tiny_llama

    hf_home = cache_root() / "hf-home"
    try:
        tiny_llama.populate_hub_cache(hf_home)
    except tiny_llama.TransformersMissing:
        return {}
    return tiny_llama.offline_env(hf_home)


def run_suite(name: str, tree: Path, files: list[str], out_dir: Path, *, depth: str = "full",
              keep: tuple[str, ...] = QUICK_DEPTH_CLASSES, timeout: float | None = None, workers: int = 0,
              node_ids: list[str] | None = None) -> SuiteRun:
    """Run ``files`` (or just ``node_ids``) of DeepSpeed's tests in ``tree``; never raises on test failures."""
    timeout = TIMEOUT[depth] if timeout is None else timeout
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = name.replace("/", "_").replace(" ", "_")
    record, log = out_dir / f"{slug}.jsonl", out_dir / f"{slug}.log"
    record.unlink(missing_ok=True)
    record.with_suffix(".deselected").unlink(missing_ok=True)
    # Paths as seen from inside tests/, where pytest runs.
    targets = node_ids if node_ids is not None else [f.removeprefix("tests/") for f in files if (tree / f).is_file()]
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, f"--report-log={record}",
        f"--zero3-sp-deselected={record.with_suffix('.deselected')}", f"--zero3-sp-depth={depth}",
        *[f"--zero3-sp-keep={k}" for k in keep], "--continue-on-collection-errors", "-rfE",
        *(["-n", str(workers)] if workers else []), *targets
    ]
    if not targets:  # pytest's "no tests collected", without starting it; the record stays absent (empty)
        log.write_text("nothing to run\n")
        code, wall = 5, 0.0
    else:
        # A same-size change made in the same second as the last run would otherwise run stale bytecode.
        for cache in sorted(tree.rglob("__pycache__"), reverse=True):
            shutil.rmtree(cache, ignore_errors=True)
        code, wall = run_logged(cmd, log, timeout=timeout, cwd=tree / "tests",
                                env=os.environ | pytest_env(tree) | hub_env())
    outcomes, messages, broken, ranks, deselected = read_record(record)
    return SuiteRun(name=name, depth=depth, files=files, log=str(log), record=str(record), workers=workers,
                    exit_code=code, timed_out=wall > 0 and wall >= timeout, wall_s=wall, outcomes=outcomes,
                    messages=messages, not_collectable=broken, ranks=ranks, deselected=deselected)


def compare_after_reruns(name: str, tree: Path, before: SuiteRun, after: SuiteRun, out_dir: Path, *, workers: int,
                         times: int = RERUNS, timeout: float = 1800) -> SuiteComparison:
    """Every passed-before/failed-after test run ``times`` more (all of them in one pytest run per round), then the
    two runs compared."""
    tests = rerun_candidates(before, after)
    reruns: dict[str, list[str]] = {t: [] for t in tests}
    for i in range(times if tests else 0):
        run = run_suite(f"rerun-{i + 1}", tree, [], out_dir, keep=(), timeout=timeout, workers=workers, node_ids=tests)
        for t in tests:
            reruns[t].append(run.outcomes.get(t, "error"))
    return compare(name, before, after, reruns)
