"""The package's twin of the upstream regression test ``TestZero3SequenceParallelGradientScale``.

Same name, same four parameter sets (reduce_scatter, contiguous_gradients, reduce_bucket_size)
as the test our series adds to DeepSpeed's ``tests/unit/v1/zero/test_zero.py``; it runs
against whatever DeepSpeed is installed, because PyPI sdists carry no ``tests/``. The harness
is ours: one real 2-rank launch (sp=2) of the reproducer covers the four configurations, and
each parametrized test asserts its own configuration's gradients, small and large parameter,
against the plain-torch oracle.

Unpatched DeepSpeed: 3 failed ([False-False-500], [True-True-500], [False-True-16]), 1 passed.
Patched: 4 passed.
"""

from __future__ import annotations

import pytest

from repro.gradscale.space import ZERO3_CONFIGS

from .conftest import REPRO, launch

pytestmark = pytest.mark.multiprocess  # starts real DeepSpeed ranks

PARAMS = [(c.reduce_scatter, c.contiguous_gradients, c.reduce_bucket_size) for c in ZERO3_CONFIGS]


@pytest.fixture(scope="module")
def zero3_report(tmp_path_factory, deepspeed_version):
    argv = ["--backend", "gloo", "--world-size", "2", "--sp", "2"]
    for config in ZERO3_CONFIGS:
        argv += ["--config", config.label()]
    run = launch(REPRO / "zero3_sp_grad_scale.py", *argv, tmp_path=tmp_path_factory.mktemp("twin"))
    if run.returncode not in (0, 1) or run.report is None:
        pytest.fail(f"the launch could not run (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return run.report


@pytest.mark.twin
@pytest.mark.parametrize("reduce_scatter,contiguous_gradients,reduce_bucket_size", PARAMS)
class TestZero3SequenceParallelGradientScale:

    def test(self, zero3_report, reduce_scatter, contiguous_gradients, reduce_bucket_size):
        rows = [
            r for r in zero3_report["rows"]
            if (r["reduce_scatter"], r["contiguous_gradients"],
                r["reduce_bucket_size"]) == (reduce_scatter, contiguous_gradients, reduce_bucket_size)
        ]
        assert sorted(r["param"] for r in rows) == ["large", "small"]
        wrong = {r["param"]: f"{r['ratio']:.4f}x the oracle via {r['path']}" for r in rows if not r["fixed_ok"]}
        assert not wrong, f"DeepSpeed {zero3_report['deepspeed_version']}, sp=2: {wrong}"
