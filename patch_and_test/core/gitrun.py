"""The one way the package runs git: hooks off (a user's or global hooks would run on our commits in the copies),
output captured, a failure as one line.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from patch_and_test.core import errors

NO_HOOKS = ("-c", "core.hooksPath=/dev/null")
# A fixed identity and date: the commits made with it have the same id on every machine and every run.
FIXED_IDENTITY = {
    f"GIT_{who}_{key}": value
    for who in ("AUTHOR", "COMMITTER")
    for key, value in (("NAME", "zero3-sp-gradfix"), ("EMAIL", "zero3-sp-gradfix@localhost"),
                       ("DATE", "2000-01-01T00:00:00+0000"))
}


def git(repo: Path | str | None, *args: str, check: bool = True, env: dict | None = None,
        input: str | bytes | None = None, text: bool = True) -> subprocess.CompletedProcess:
    """``git -C repo args`` (no ``-C`` for repo None, e.g. clone); hooks off, output captured."""
    where = ("-C", str(repo)) if repo is not None else ()
    return subprocess.run(["git", *where, *NO_HOOKS, *args], capture_output=True, text=text, check=check, env=env,
                          input=input)


def git_out(repo: Path | str | None, *args: str, env: dict | None = None, input: str | None = None) -> str:
    """Its stdout; a failure raises ``BadInput`` with git's last error line."""
    result = git(repo, *args, check=False, env=env, input=input)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        where = f" in {repo}" if repo is not None else ""
        raise errors.BadInput(f"git {' '.join(args[:2])}{where} failed: {message[-1] if message else '?'}")
    return result.stdout
