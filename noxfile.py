"""nox sessions: the same jobs as tox.ini, one shared implementation (the patch_and_test package).

  nox -s patch-and-test                    newest supported DeepSpeed, gloo
  nox -s "matrix(version='X.Y.Z', backend='gloo')"    one cell (`nox -l` lists them); `nox -s matrix` for all
  nox -s tests                             the package's tests, newest and oldest DeepSpeed
  nox -s upstream-lint | bundle | verify-bundle
  nox -s downstream                        the real clients' sp loss code, one session per client version

Versions come from deepspeed-sdists.lock, so a release added there is in the matrix at once (tox.ini's
too, through toxfile.py); torch's and the lint tools' from requirements/pins.txt (``$TORCH_SPEC`` overrides
torch's), as in tox.ini.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT))
from patch_and_test.job.cli import build_parser, results_dir  # noqa: E402
from patch_and_test.core import pins  # noqa: E402
from patch_and_test.downstream.run import CLIENT_ENVS  # noqa: E402
from patch_and_test.core.errors import Exit  # noqa: E402
from patch_and_test.core.series import parse_version  # noqa: E402
from patch_and_test.core.source import load_lock  # noqa: E402

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["patch-and-test", "tests"]

if "PIP_FIND_LINKS" in os.environ:  # uv ignores pip's config; see tox.ini
    os.environ.setdefault("UV_FIND_LINKS", os.environ["PIP_FIND_LINKS"])
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")

TORCH = pins.torch_requirement()
BACKENDS = ["gloo", "nccl"]
VERSIONS = sorted(load_lock(), key=parse_version)
TEST_VERSIONS = [VERSIONS[-1], VERSIONS[0]]  # newest and oldest

# Every session's base: torch, the DeepSpeed runtime, the package (with the maintainers' part) and the tests'.
RUNTIME = (TORCH, "-r", "requirements/deepspeed-runtime.txt", "-r", "requirements/package.txt", "-r",
           "requirements/maint.txt", "-r", "requirements/test.txt", "uv")


def _env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), **extra}


def _install_runtime(session: nox.Session, alst: bool = False) -> None:
    # alst: transformers, for the job's ALST reproducer step (DeepSpeed >= checks.ALST_MIN_VERSION), as in tox.ini.
    session.install(*RUNTIME, *(["-r", "requirements/alst.txt"] if alst else []))


def patch_and_test_impl(session: nox.Session, env_name: str, version: str | None, backend: str, *args: str) -> None:
    """The one implementation behind every patch-and-test session: python -m patch_and_test run."""
    _install_runtime(session, alst=True)
    env = _env(ZERO3_SP_BACKEND=backend)
    if version:
        env["DEEPSPEED_VERSION"] = version
    argv = ["--env-name", env_name, *args, *session.posargs]
    session.run("python", "-m", "patch_and_test", "run", *argv, env=env, success_codes=[0, Exit.SKIPPED])
    # Exit 77 (e.g. nccl with fewer GPUs than ranks) is a skip, shown as one in nox's summary.
    outcome = json.loads((results_dir(build_parser().parse_args(argv)) / "verdict.json").read_text())
    if outcome["outcome"] == "skipped":
        session.skip(outcome["error"])


@nox.session(name="patch-and-test")
def patch_and_test(session: nox.Session) -> None:
    patch_and_test_impl(session, "patch-and-test", os.environ.get("DEEPSPEED_VERSION"),
                        os.environ.get("ZERO3_SP_BACKEND", "gloo"))


@nox.session(name="patch-and-test-newest")
def patch_and_test_newest(session: nox.Session) -> None:
    """The pull-request series on the newest-upstream tree (needs the mirror: DEEPSPEED_MIRROR)."""
    patch_and_test_impl(session, "patch-and-test-newest", None, os.environ.get("ZERO3_SP_BACKEND", "gloo"),
                        "--newest-upstream")


@nox.session
@nox.parametrize("backend", BACKENDS)
@nox.parametrize("version", VERSIONS)
def matrix(session: nox.Session, version: str, backend: str) -> None:
    # Same results folder as the tox env of this cell, so the bundle reads either.
    patch_and_test_impl(session, f"patch-and-test-ds{version}-{backend}", version, backend)


@nox.session
@nox.parametrize("version", TEST_VERSIONS)
def tests(session: nox.Session, version: str) -> None:
    # the newest only, as tox's {alst_if_newest}: the ALST tests need DeepSpeed >= checks.ALST_MIN_VERSION
    _install_runtime(session, alst=version == VERSIONS[-1])
    session.install("-r", "requirements/accelerate.txt")  # the doctor's accelerate-config tests, as in tox.ini
    session.run("python", "-m", "patch_and_test", "selftest", *session.posargs, env=_env(DEEPSPEED_VERSION=version))


@nox.session(name="upstream-lint")
def upstream_lint(session: nox.Session) -> None:
    session.install("-c", str(pins.PINS_FILE), "yapf", "flake8", "codespell", "-r", "requirements/package.txt")
    session.run("python", "-m", "patch_and_test", "lint", *session.posargs, env=_env())


@nox.session
def bundle(session: nox.Session) -> None:
    _install_runtime(session, alst=True)
    session.run("python", "-m", "patch_and_test", "bundle", "build", *session.posargs, env=_env())


@nox.session(name="verify-bundle")
def verify_bundle(session: nox.Session) -> None:
    session.install("-r", "requirements/package.txt", "-r", "requirements/maint.txt")
    session.run("python", "-m", "patch_and_test", "bundle", "verify", *session.posargs, env=_env())


@nox.session
@nox.parametrize("client", [env.removeprefix("downstream-") for env in CLIENT_ENVS])
def downstream(session: nox.Session, client: str) -> None:
    # Same results folder as the tox env, so the table and the bundle read either; the driver takes the env's
    # clients from CLIENT_ENVS by its name.
    requirements = CLIENT_ENVS[f"downstream-{client}"][0]
    session.install(*RUNTIME, "-r", requirements)
    session.run("python", "-m", "patch_and_test", "downstream", "run", "--env-name", f"downstream-{client}",
                *session.posargs, env=_env())
