"""The whole job for real: ``python -m patch_and_test run`` on the installed DeepSpeed's release.

Downloads (or reuses) the verified sdist, installs it unpatched, sees the bug with both
reproducers (exit 1 under --expect fixed would be the bug: here --expect buggy holds), applies the
series, builds and installs the patched DeepSpeed, and sees the bug gone: both reproducers exit 0
under --expect fixed and the twin of the upstream regression test passes 4 of 4. Afterwards the
unpatched build (a cached wheel) is put back, so the other tests keep their DeepSpeed.

The same run's results then make a review bundle (its cell is reused, not run again), which
``bundle verify`` accepts, and rejects once a number in PR.md or a byte of a patch changes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.core.checks import REPRODUCERS
from repro.harness.env import dist_version
from repro.harness.fixed import source_has_fix

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.pipeline, pytest.mark.network, pytest.mark.multiprocess, pytest.mark.slow_tier]


def installed_stage3_has_fix() -> bool:
    code = "import deepspeed.runtime.zero.stage3 as m; print(m.__file__)"
    path = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={
        **os.environ, "DS_ACCELERATOR": "cpu"
    }).stdout.strip().splitlines()[-1]
    return source_has_fix(Path(path).read_text())


@pytest.fixture(scope="module")
def release():
    if (installed := dist_version("deepspeed")) is None:
        pytest.skip("no DeepSpeed installed (the tox tests envs install one)")
    version = installed.split("+")[0]
    yield version
    # Put the unpatched release back (its wheel is cached: seconds), whatever the test did.
    subprocess.run([sys.executable, "-m", "patch_and_test", "install", "--pypi", version], check=True, cwd=ROOT,
                   capture_output=True)
    assert not installed_stage3_has_fix()


@pytest.fixture(scope="module")
def job(release, tmp_path_factory):
    """One real run of the whole job, in the results layout the bundle reads."""
    assert not installed_stage3_has_fix(), "the tests expect the unpatched release installed"
    root = tmp_path_factory.mktemp("job")
    env_name = f"patch-and-test-ds{release}-gloo"
    results = root / "results" / env_name
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSPEED_SRC", "ZERO3_SP_BACKEND")}
    proc = subprocess.run([
        sys.executable, "-m", "patch_and_test", "run", "--version", release, "--no-audit", "--results",
        str(results), "--env-name", env_name
    ], capture_output=True, text=True, cwd=ROOT, env={
        **env, "DEEPSPEED_VERSION": release
    }, timeout=3000)
    return proc, root, results


def bundle(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "patch_and_test", "bundle", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_patch_and_test_sees_the_bug_before_and_not_after(job):
    proc, _, results = job
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    verdict = json.loads((results / "verdict.json").read_text())
    assert verdict["outcome"] == "fixed"
    by_name = {c["name"]: c for c in verdict["before"] + verdict["after"]}
    for script in REPRODUCERS:
        assert by_name[f"before/{script}"]["exit_code"] == 0 and by_name[f"before/{script}"]["pattern"] == "buggy"
        assert by_name[f"after/{script}"]["exit_code"] == 0 and by_name[f"after/{script}"]["pattern"] == "fixed"
    twin = next(t for t in verdict["tests"] if t["name"].startswith("twin"))
    assert sorted(twin["outcomes"].values()) == ["passed"] * 4
    assert "outcome: fixed (exit 0)" in proc.stdout
    # The env keeps the patched build: a maintainer can use its python afterwards.
    assert installed_stage3_has_fix()


def test_bundle_from_the_run_verifies_and_catches_tampering(job, release, tmp_path):
    proc, root, _ = job
    assert proc.returncode == 0, proc.stdout[-3000:]
    dist = tmp_path / "dist"
    built = bundle("build", "--results", str(root / "results"), "--dist", str(dist), "--versions", release,
                   "--backends", "gloo", "--no-audit")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "1/1 matrix cells reused" in built.stdout
    [path] = [p for p in dist.iterdir() if p.is_dir()]
    assert (dist / f"{path.name}.tar.gz").exists()
    ok = bundle("verify", str(path))
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # One number in EVIDENCE.md (the numbers' page; PR.md is the short body): the first ratio of the matrix.
    evidence = path / "EVIDENCE.md"
    original = evidence.read_text()
    ratio = re.search(r"\b(0\.5000|1\.0000)\b", original)
    assert ratio, "EVIDENCE.md shows no ratio"
    evidence.write_text(original[:ratio.start()] + ("0.5001" if ratio.group(1) == "0.5000" else "1.0001") +
                        original[ratio.end():])
    bad = bundle("verify", str(path))
    assert bad.returncode != 0 and "EVIDENCE.md" in bad.stderr
    evidence.write_text(original)
    assert bundle("verify", str(path)).returncode == 0

    # One byte of a patch.
    patch = sorted((path / "patches").rglob("0001-*.patch"))[0]
    data = bytearray(patch.read_bytes())
    data[-2] ^= 1
    patch.write_bytes(bytes(data))
    bad = bundle("verify", str(path))
    assert bad.returncode != 0 and patch.name in bad.stderr
