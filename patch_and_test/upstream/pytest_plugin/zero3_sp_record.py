"""A pytest plugin for DeepSpeed's own test suite: picks a depth and records every result as JSON lines.

Loaded into DeepSpeed's pytest with ``-p zero3_sp_record`` (only its folder on PYTHONPATH): it imports nothing
of ours. The record's lines are described in docs/code/patch-and-test-review-upstream.md.
"""

from __future__ import annotations

import json
import os

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("zero3-sp-gradfix")
    group.addoption("--zero3-sp-record", default=None, help="append results here as JSON lines")
    group.addoption("--zero3-sp-depth", default="full", choices=("quick", "full"))
    group.addoption("--zero3-sp-keep", action="append", default=[], help="a test class the quick depth keeps")


def _write(config, **entry) -> None:
    """Append one line and close the file: a run killed at its deadline still leaves what it did."""
    path = config.getoption("--zero3-sp-record")
    if not path:
        return
    entry["pid"] = os.getpid()
    with open(path, "a") as out:
        out.write(json.dumps(entry) + "\n")


def _one_line(longrepr) -> str:
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        reason = str(longrepr[2]).strip()
        return reason.splitlines()[0] if reason else ""
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None and getattr(crash, "message", None) else str(longrepr)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # The error line of a traceback ("E   ModuleNotFoundError: ...") says the most.
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors or lines or [""])[0][:300]


def needs_ranks(item) -> bool:
    cls = getattr(item, "cls", None)
    return cls is not None and any(base.__name__ == "DistributedExec" for base in cls.__mro__)


def pytest_configure(config):
    config.pluginmanager.register(_Recorder(config), "zero3_sp_recorder")


class _Recorder:
    """The hooks that need the config (a collect or test report does not carry it)."""

    def __init__(self, config):
        self.config = config

    def pytest_collectreport(self, report):
        if report.nodeid.endswith(".py") and (report.failed or report.skipped):
            _write(self.config, kind="collect-error" if report.failed else "collect-skip", path=report.nodeid,
                   message=_one_line(report.longrepr))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep_classes = set(config.getoption("--zero3-sp-keep"))
        quick = config.getoption("--zero3-sp-depth") == "quick"
        kept, dropped = [], []
        for item in items:
            ranks = needs_ranks(item)
            drop = quick and ranks and item.cls.__name__ not in keep_classes
            (dropped if drop else kept).append(item)
            _write(config, kind="deselected" if drop else "collected", nodeid=item.nodeid, ranks=ranks)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def pytest_runtest_logreport(self, report):
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller records it
        outcome = report.outcome
        if getattr(report, "wasxfail", None) is not None:
            outcome = "skipped" if report.skipped else "failed"  # xfail / strict xpass
        _write(self.config, kind="report", nodeid=report.nodeid, when=report.when, outcome=outcome,
               message=_one_line(report.longrepr) if outcome != "passed" else "",
               duration=round(getattr(report, "duration", 0.0), 3))
