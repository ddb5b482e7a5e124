"""The pipeline's checks, each a logged subprocess: the reproducers (by exit code and report), pytest suites (by
JUnit XML)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import pins
from patch_and_test.core.errors import Exit
from patch_and_test.core.series import parse_version
from repro.harness.report import Record
from repro.gradscale.space import SCRIPTS
from repro.harness.env import dist_version
from repro.harness.launch import kill_groups

REPRODUCERS = SCRIPTS  # the gradient-scale family's programs
AUDIT = "parity_audit"  # same contract as the reproducers; its --timeout bounds the whole audit
# In the job, the audit's quick mode at 2 ranks (sp 1 x dp 2, sp 2 x dp 1); the 4-rank layouts run in its tests.
SCRIPT_ARGS = {AUDIT: ("--world-size", "2")}
ALST = "alst_recipe"  # the ALST loss recipe's scale; needs transformers and DeepSpeed >= 0.17.2
ALST_MIN_VERSION = "0.17.2"  # UlyssesSPAttentionHF appears

ALST_REQUIREMENTS = PACKAGE_ROOT / "requirements" / "alst.txt"  # the one place the ALST steps' transformers is pinned


def alst_pin_problem() -> str | None:
    """Why this transformers cannot run the ALST steps (not the pin: 5.24 fails in the ranks), or None."""
    want = pins.version("transformers", ALST_REQUIREMENTS)
    installed = dist_version("transformers")
    if installed in (None, want):
        return None  # None: the steps are skipped, with the reason (alst_unavailable)
    return (f"the ALST recipe steps need transformers=={want} (requirements/alst.txt) and this environment has "
            f"transformers {installed}: pip install -r requirements/alst.txt, or run in an env without transformers")


def alst_unavailable(deepspeed_version: str) -> str | None:
    if parse_version(deepspeed_version) < parse_version(ALST_MIN_VERSION):
        return f"DeepSpeed {deepspeed_version} has no UlyssesSPAttentionHF (from {ALST_MIN_VERSION})"
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install -r requirements/alst.txt)"
    return None


OUTCOMES = ("passed", "failed", "error", "skipped")  # a test's outcome, as JUnit and the suites' records give it


def outcome_counts(outcomes: dict[str, str]) -> dict[str, int]:
    return {k: sum(1 for o in outcomes.values() if o == k) for k in OUTCOMES}


def ended_early(error_exit: Exit | None) -> tuple[str, Exit]:
    """The outcome of a job a PipelineError ended (its exit code; none given: an error): both jobs' verdicts."""
    code = Exit(error_exit if error_exit is not None else Exit.ERROR)
    return (code.outcome if code in (Exit.SKIPPED, Exit.SERIES_DOES_NOT_APPLY, Exit.ALREADY_FIXED) else "error"), code


class ReproCheck(Record):
    name: str  # e.g. "before/zero3_sp_grad_scale"
    script: str
    expect: str
    exit_code: int
    pattern: str | None  # the report's "fixed" | "buggy" | "other"; None when no report was written
    report: str | None  # path of the JSON report
    log: str
    duration_s: float

    @property
    def holds(self) -> bool:
        return self.exit_code == 0


class PytestCheck(Record):
    name: str
    exit_code: int
    outcomes: dict[str, str]  # test id -> "passed" | "failed" | "error" | "skipped"
    junit: str
    log: str
    duration_s: float

    @property
    def counts(self) -> dict[str, int]:
        return outcome_counts(self.outcomes)


def run_reproducer(script: str, expect: str, out_dir: Path, phase: str, *, backend: str, timeout: float) -> ReproCheck:
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / f"{script}.json"
    log = out_dir / f"{script}.log"
    report.unlink(missing_ok=True)
    args = ["--expect", expect, "--backend", backend, "--json", str(report), "--timeout", str(timeout)]
    cmd = [sys.executable, str(PACKAGE_ROOT / "repro" / f"{script}.py"), *args, *SCRIPT_ARGS.get(script, ())]
    code, duration = run_logged(cmd, log, timeout=timeout + 60, cwd=PACKAGE_ROOT)
    pattern = _pattern(json.loads(report.read_text())) if report.exists() else None
    return ReproCheck(name=f"{phase}/{script}", script=script, expect=expect, exit_code=code, pattern=pattern,
                      report=str(report) if report.exists() else None, log=str(log), duration_s=duration)


def _pattern(report: dict) -> str | None:
    if "pattern" in report:
        return report["pattern"]
    counts = report.get("summary", {}).get("counts")  # the parity audit: its category counts
    if counts:
        return (f"{counts['sp_bug']} at 1/sp, {counts['match']} match, {counts['known']} known, "
                f"{counts['unexplained']} unexplained, {counts['rejected']} rejected")
    return None


def run_pytest(name: str, args: list[str], out_dir: Path, *, cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 3600) -> PytestCheck:
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^\w.-]+", "-", name)  # a file name a Markdown link can carry: no spaces, no slashes
    junit = out_dir / f"{slug}.junit.xml"
    log = out_dir / f"{slug}.log"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", f"--junitxml={junit}", *args]
    code, duration = run_logged(cmd, log, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    return PytestCheck(name=name, exit_code=code, outcomes=junit_outcomes(junit), junit=str(junit), log=str(log),
                       duration_s=duration)


def junit_outcomes(junit: Path) -> dict[str, str]:
    if not junit.exists():
        return {}
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tag = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed")
        outcomes[f"{case.get('classname', '')}::{case.get('name')}"] = {"failure": "failed"}.get(tag, tag)
    return outcomes


def run_logged(cmd: list[str], log: Path, *, timeout: float, cwd: Path, env: dict | None = None) -> tuple[int, float]:
    start = time.monotonic()
    with open(log, "w") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        # A SIGTERM to the job must take the check down too: raise, so that the handler below kills it. Set before
        # the check starts; one that lands inside Popen waits until there is a process to kill.
        proc, deferred = None, []

        def on_sigterm(signum: int, frame) -> None:
            if proc is None:
                deferred.append(signum)
            else:
                raise SystemExit(128 + signum)

        previous = (signal.signal(signal.SIGTERM, on_sigterm)
                    if threading.current_thread() is threading.main_thread() else None)
        try:
            # Its own session, so that a deadline takes its whole group down. A reproducer's ranks have sessions of
            # their own: the SIGTERM first lets their launcher stop them (and they die with it, whatever kills it).
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                    start_new_session=True)
            try:
                if deferred:
                    raise SystemExit(128 + deferred[0])
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_groups([proc])
                out.write(f"\nerror: killed after {timeout:.0f} s\n")
                code = 2
            except BaseException:
                kill_groups([proc])
                raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    return code, round(time.monotonic() - start, 3)
