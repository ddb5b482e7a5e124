#!/usr/bin/env python
"""The README's test command (``python -m tox -m tests``) in a fresh clone of HEAD, timed cold (empty caches) then
warm. Writes results/benchmarks/test_command.json; exit 0 when both pass within the targets (300 / 180 s).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_result  # noqa: E402
from patch_and_test.review.benchmark_reports import CommandRun, TestCommand, ToxEnv  # noqa: E402

COMMAND = [sys.executable, "-m", "tox", "-m", "tests"]
# tox's summary: "  tests-ds0.19.8: OK (781.2=setup[58.1]+cmd[723.1] seconds)"
ENV_LINE = re.compile(r"^\s*(\S+): (OK|FAIL\S*|SKIP\S*).*?\(([\d.]+)=setup\[([\d.]+)\]\+cmd\[([\d.]+)\] seconds\)")
PYTEST_LINE = re.compile(r"^=+ (.*(?:passed|failed|error).* in [\d.]+s.*?) =+$")


def run_once(clone: Path, env: dict[str, str], log: Path) -> CommandRun:
    start = time.monotonic()
    load = os.getloadavg()
    proc = subprocess.run(COMMAND, cwd=clone, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    out = proc.stdout + proc.stderr
    log.write_text(out)
    envs = [
        ToxEnv(env=m[1], status=m[2], total_s=float(m[3]), setup_s=float(m[4]), cmd_s=float(m[5]))
        for m in (ENV_LINE.match(line) for line in out.splitlines()) if m
    ]
    pytest_lines = [m[1] for m in (PYTEST_LINE.match(line.strip()) for line in out.splitlines()) if m]
    return CommandRun(exit_code=proc.returncode, wall_s=round(wall, 1), load_average_at_start=load,
                      load_average_at_end=os.getloadavg(), envs=envs, pytest=pytest_lines, log=log.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", nargs=2, type=float, default=(300.0, 180.0), metavar=("COLD", "WARM"),
                        help="the longest the cold and the warm run may take, s (default 300 180)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default results/benchmarks/test_command.json)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the clone and caches here (default: a temp dir)")
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    work = Path(args.keep or tempfile.mkdtemp(prefix="zero3-sp-test-command."))
    clone, caches = work / "clone", work / "caches"
    subprocess.run(["git", "clone", "-q", "--no-local", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", head], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOX_", "VIRTUAL_ENV"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on CI
    env.update(ZERO3_SP_CACHE=str(caches / "zero3-sp"), UV_CACHE_DIR=str(caches / "uv"),
               XDG_CACHE_HOME=str(caches / "xdg"), PIP_CACHE_DIR=str(caches / "pip"))
    runs = {}
    for name in ("cold", "warm"):
        run = runs[name] = run_once(clone, env, work / f"{name}.log")
        print(
            f"{name}: exit {run.exit_code}, {run.wall_s} s; " +
            "; ".join(f"{e.env} setup {e.setup_s} s + cmd {e.cmd_s} s" for e in run.envs), flush=True)
    cold, warm = runs["cold"], runs["warm"]
    cold_target, warm_target = args.targets
    ok = cold.exit_code == 0 and warm.exit_code == 0 and cold.wall_s <= cold_target and warm.wall_s <= warm_target
    result = TestCommand(benchmark="test_command", command="tox -m tests", commit=head, cpus=os.cpu_count(),
                         targets_s=dict(cold=cold_target, warm=warm_target), runs=runs, meets_targets=ok)
    path = write_result(result, args.out)
    print(f"cold {cold.wall_s} s (target {cold_target}), warm {warm.wall_s} s "
          f"(target {warm_target}): {'OK' if ok else 'MISSED'}; {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
