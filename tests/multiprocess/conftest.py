"""Helpers for tests that launch real ranks of real DeepSpeed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "repro"


@dataclass
class Launch:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None


def launch(script: Path, *argv: str, timeout: float = 600, env: dict | None = None,
           tmp_path: Path | None = None) -> Launch:
    json_path = None
    if tmp_path is not None:
        json_path = tmp_path / f"{script.stem}-{abs(hash(argv))}.json"
        argv = (*argv, "--json", str(json_path))
    proc = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=timeout, env={
        **os.environ,
        **(env or {})
    }, cwd=ROOT)
    report = json.loads(json_path.read_text()) if json_path is not None and json_path.exists() else None
    return Launch(proc.returncode, proc.stdout, proc.stderr, report)


def popen_interruptible(argv: list[str], **kwargs) -> subprocess.Popen:
    """Popen in the checkout, SIGINT's default action restored in the child: a shell's background job (CI) inherits
    it ignored, and the test's Ctrl-C would not reach the program."""
    return subprocess.Popen(argv, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


@pytest.fixture(scope="session")
def deepspeed_version() -> str:
    pytest.importorskip("deepspeed")
    import importlib.metadata

    return importlib.metadata.version("deepspeed")
