"""``zero3-sp selftest --version V [--tier fast|slow|all]``: the package's tests on DeepSpeed V.

Installs the unpatched release V from its verified sdist, then runs pytest on a tier (``--tier``, env
``ZERO3_SP_TEST_TIER``; CONTRIBUTING.md, "Tests"):

* fast (default): on the newest release every test not marked ``slow_tier``; on an older one the reproducers'
  real 2-rank launches and the twin (``every_release``, less ``slow_tier`` and ``four_ranks``);
* slow: the ``slow_tier`` tests on the newest; on an older release every other test under ``tests/multiprocess``
  and ``tests/pipeline`` (the reproducers' 4-rank launches, the launcher's failure paths, bad input...);
* all: both.

Extra arguments go to pytest: options (``-x``) are added to the tier's choice, a path, node id or
``-m``/``-k`` expression replaces it. tox and nox both call this, so the rule lives here only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from patch_and_test.core import install
from patch_and_test.core.source import newest_locked
from patch_and_test.core.errors import CommandParser

VERSION_DEPENDENT = ("tests/multiprocess", "tests/pipeline")
# On an older release, the fast tier; its slow tier is the rest, so that no test falls between them. The 4-rank
# launches go to the slow tier: each costs a fast-tier 2-rank launch twice over. The fast tier collects only the
# file that holds its tests (collecting the two folders costs 2 s).
OLDER_FAST = "every_release and not slow_tier and not four_ranks"
OLDER_FAST_FILES = ("tests/multiprocess/test_reproducers_unpatched.py", )
TIERS = ("fast", "slow", "all")


def test_args(version: str, tier: str = "fast") -> list[str]:
    """pytest's arguments for one release and tier (see the module docstring)."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
    is_newest = version == newest_locked()
    if tier == "all":
        return ["tests"] if is_newest else list(VERSION_DEPENDENT)
    if is_newest:
        return ["tests", "-m", "slow_tier" if tier == "slow" else "not slow_tier"]
    if tier == "fast":
        return [*OLDER_FAST_FILES, "-m", OLDER_FAST]
    return [*VERSION_DEPENDENT, "-m", f"not ({OLDER_FAST})"]


def pytest_command(extra: list[str], version: str, tier: str) -> list[str]:
    """The tier's choice plus the caller's options; a path, node id, -m or -k of the caller's replaces the choice."""
    replaces = any(not a.startswith("-") or a in ("-m", "-k") or a.startswith(("-m=", "-k=")) for a in extra)
    return list(extra) if replaces else [*test_args(version, tier), *extra]


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="zero3-sp selftest", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=os.environ.get("DEEPSPEED_VERSION") or None,
                        help="a supported DeepSpeed release (default: the newest; env DEEPSPEED_VERSION)")
    parser.add_argument("--tier", choices=TIERS, default=os.environ.get("ZERO3_SP_TEST_TIER") or "fast",
                        help="fast (default), slow, or all (env ZERO3_SP_TEST_TIER)")
    args, pytest_args = parser.parse_known_args(argv)
    version = args.version or newest_locked()
    code = install.main(["--pypi", version])
    if code != 0:
        return code
    # The fast tier on every core, up to 4 (its tests are independent; the slow tier shares caches and checkouts).
    # worksteal: an idle worker takes queued tests from a busy one; the launches are long and uneven (on 2 cores,
    # warm, 114-115 s against 132-154 s with xdist's default).
    xdist = ["-n", "auto", "--maxprocesses", "4", "--dist", "worksteal"] if args.tier == "fast" else []
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-ra", *xdist,
        *pytest_command(pytest_args, version, args.tier)
    ]
    print(f"$ {' '.join(cmd)}", flush=True)
    # pytest's own exit code, 5 (nothing collected) included: the caller treats anything but 0 as failure.
    return subprocess.run(cmd, env={**os.environ, "DEEPSPEED_VERSION": version}).returncode
