"""repro/downstream_clients.py for real: the installed clients' own sp loss code on ranks of the installed DeepSpeed.

Skips unless an installed client has sp loss code to call (transformers >= 5.0, ArcticTraining, trl 1.16,
axolotl): the package's own test envs pin transformers 4.57.6, so these run in the `downstream-*` envs or
wherever such a client is installed. Whichever DeepSpeed is installed, exactly one of
--expect buggy / --expect fixed holds for a transformers 5.x or ArcticTraining row set (their
ZeRO-3 rule values differ with and without the fix), and a measured row always carries the rule's
value, its ratio and a verdict.
"""

from __future__ import annotations

import pytest

from .conftest import REPRO, launch

pytestmark = pytest.mark.multiprocess  # starts real DeepSpeed ranks

SCRIPT = REPRO / "downstream_clients.py"
TIMEOUT = "1500"


@pytest.fixture(autouse=True)
def _needs_a_client(deepspeed_version):
    from repro.alst.measure import skip_reason
    from repro.downstream.measure import find_clients

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    callable_clients = [c for c in find_clients() if c.call is not None]
    if not callable_clients:
        pytest.skip("no installed client has sp loss code to call (transformers >= 5.0 or ArcticTraining)")


def test_exactly_one_expectation_holds(tmp_path):
    runs = {
        e: launch(SCRIPT, "--expect", e, "--backend", "gloo", "--timeout", TIMEOUT, tmp_path=tmp_path, timeout=3000)
        for e in ("buggy", "fixed")
    }
    for run in runs.values():
        assert run.returncode in (0, 1), run.stdout + run.stderr
        measured = [r for r in run.report["rows"] if r["status"] == "measured"]
        assert {r["stage"] for r in measured} == {2, 3}
        assert all(r["residual"] < 1e-4 and r["verdict"] for r in measured)
        # trl's and axolotl's entries wrap transformers' sp loss: the run saw them reach it
        assert all(r["reached"] for r in measured if r["client"] in ("trl", "axolotl"))
    assert sorted(r.returncode for r in runs.values()) == [0, 1], {e: r.stdout for e, r in runs.items()}
    held = next(e for e, r in runs.items() if r.returncode == 0)
    assert runs[held].report["deepspeed_fixed"] == (held == "fixed")
