"""``python -m patch_and_test.selftest --version V``: the package's own tests against DeepSpeed V.

Installs the unpatched release V from its verified sdist (a cached wheel after the first time),
then runs pytest. Which tests: everything against the newest supported release; against an older
one, only what depends on the DeepSpeed version (real ranks, the whole job), since the rest
(unit tests, git and PyPI checks of the series) does not change with it. Extra arguments go to
pytest and replace that choice. tox and nox both call this, so the rule lives here only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from patch_and_test import install
from patch_and_test.series import parse_version
from patch_and_test.source import load_lock

VERSION_DEPENDENT = ("tests/multiprocess", "tests/pipeline")


def newest() -> str:
    return max(load_lock(), key=parse_version)


def test_paths(version: str) -> list[str]:
    return ["tests"] if version == newest() else list(VERSION_DEPENDENT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m patch_and_test.selftest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=os.environ.get("DEEPSPEED_VERSION") or None,
                        help="a supported DeepSpeed release (default: the newest; env DEEPSPEED_VERSION)")
    args, pytest_args = parser.parse_known_args(argv)
    version = args.version or newest()
    code = install.main(["--pypi", version])
    if code != 0:
        return code
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-ra", *(pytest_args or test_paths(version))]
    print(f"$ {' '.join(cmd)}", flush=True)
    # pytest's own exit code, 5 (nothing collected) included: the caller treats anything but 0 as failure.
    return subprocess.run(cmd, env={**os.environ, "DEEPSPEED_VERSION": version}).returncode


if __name__ == "__main__":
    sys.exit(main())
