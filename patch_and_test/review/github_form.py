"""The master series in the form a GitHub pull request needs: branch, title, body, squash message.

DeepSpeed merges pull requests by squash: one commit whose message is the PR title and a body,
with the DCO sign-offs. ``write`` puts into ``<bundle>/github/``:

* ``pr-title.txt`` and ``pr-body.md`` (the bundle's PR.md without its title line);
* ``squash-message.txt``: the squash commit's message: the title, then the body, which ends with the
  sign-offs;
* ``zero3-sp-grad-scale.bundle``: a git bundle of the branch ``zero3-sp-grad-scale``, the master
  series committed on its real base commit (the bundle's one prerequisite), and ``README.md``
  with the commands that fetch it.

The branch is built with git plumbing on the base commit itself: for each patch, ``git mailinfo``
(author, date, message), ``git apply --cached`` into an index of the base tree, ``write-tree``
and ``commit-tree``, which is what ``git am`` does, minus the checkout. So it needs no working
tree of the base, and a mirror that lacks some of the base's blobs (never touched by the series)
still gives the exact commits. The committer and its date are fixed, so the same series gives
the same commit ids anywhere.

``verify`` re-renders the title, body and squash message; with a DeepSpeed mirror it also
checks the branch: it fetches the bundle into a clone at the base and compares it with a real
``git am`` of the series there.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from patch_and_test.core import errors
from patch_and_test.core.gitrun import git, git_out
from patch_and_test.core.series import Series, apply_series, patch_subject
from patch_and_test.core.source import (FIXED_IDENTITY, NEWEST_UPSTREAM, build_graft, from_series_base,
                                        load_newest_upstream)

BRANCH = "zero3-sp-grad-scale"
BUNDLE_FILE = f"{BRANCH}.bundle"
TRAILER = re.compile(r"^(Fixes|Link|Reported-by|Signed-off-by|Co-developed-by|Suggested-by): ")
# The committer of the branch's commits: fixed, so that their ids do not depend on who builds it.
COMMITTER = {k: v for k, v in FIXED_IDENTITY.items() if k.startswith("GIT_COMMITTER_")}


def _mailinfo(patch: Path, scratch: Path) -> tuple[dict[str, str], str, Path]:
    """(headers, message, diff file) of one format-patch file, as ``git am`` reads it."""
    msg, diff = scratch / "msg", scratch / "diff"
    out = git(None, "mailinfo", str(msg), str(diff), input=patch.read_bytes(), text=False).stdout.decode()
    info = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return info, msg.read_text(), diff


def split_message(message: str) -> tuple[list[str], list[str]]:
    """(body lines, trailer lines) of a commit message without its subject."""
    lines = message.rstrip("\n").splitlines()
    trailers = [line for line in lines if TRAILER.match(line)]
    body = [line for line in lines if not TRAILER.match(line)]
    while body and not body[-1].strip():
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    return body, trailers


def title(series: Series) -> str:
    """The pull request's title: the subject of the series' first patch (as PR.md's, review.context)."""
    return patch_subject(series.patches[0].path)


def pr_body(pr_markdown: str) -> str:
    """PR.md without its ``# title`` line: what goes into GitHub's description box."""
    first, _, rest = pr_markdown.partition("\n")
    return rest.lstrip("\n") if first.startswith("# ") else pr_markdown


def squash_message(series: Series, pr_markdown: str) -> str:
    """The squash commit's message: the pull request's title, then its body (PR.md), whose last lines are
    the sign-offs (DeepSpeed squash-merges with the title and description as the message)."""
    return f"{title(series)}\n\n{pr_body(pr_markdown).rstrip()}\n"


def base_repo(series: Series, mirror: Path) -> Path:
    """A repository holding the series' base: the mirror, or the newest-upstream graft built from it."""
    if series.base_ref != NEWEST_UPSTREAM:
        return mirror
    wanted = load_newest_upstream()
    repo, graft = build_graft(wanted.release, wanted.history, mirror)
    return repo


def build_branch(mirror: Path, series: Series, work: Path) -> tuple[Path, str]:
    """(repo, head) of ``BRANCH``: the series committed on ``series.base_commit`` in a scratch clone."""
    repo = work / "branch.git"
    git_out(None, "clone", "-q", "--bare", "--shared", str(base_repo(series, mirror)), str(repo))
    if git(repo, "cat-file", "-e", f"{series.base_commit}^{{commit}}", check=False).returncode != 0:
        raise errors.BadInput(f"{series.base_commit[:12]} (the {series.name} series' base) is not in {mirror}")
    index = work / "index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index), **COMMITTER}
    git(repo, "read-tree", series.base_commit, env=env)
    head = series.base_commit
    for patch in series.patches:
        info, message, diff = _mailinfo(patch.path, work)
        applied = git(repo, "apply", "--cached", "--whitespace=nowarn", str(diff), check=False, env=env)
        if applied.returncode != 0:
            raise errors.SeriesDoesNotApply(f"{patch.file} does not apply to {series.base_commit[:12]}: "
                                            f"{applied.stderr.strip().splitlines()[0]}")
        tree = git(repo, "write-tree", "--missing-ok", env=env).stdout.strip()
        author = {
            "GIT_AUTHOR_NAME": info["Author"],
            "GIT_AUTHOR_EMAIL": info["Email"],
            "GIT_AUTHOR_DATE": info["Date"]
        }
        full = f"{info['Subject']}\n\n{message}"
        head = git_out(repo, "commit-tree", tree, "-p", head, input=full, env={**env, **author}).strip()
    git(repo, "update-ref", f"refs/heads/{BRANCH}", head)
    return repo, head


README = """# The master series as a branch

`{bundle}` holds the branch `{branch}`: the master series (v{version}) committed on
`{base}` ({base_ref}), head `{head}`. Its only prerequisite is that base commit.
{where}
```bash
git bundle verify /path/to/{bundle}
git fetch /path/to/{bundle} {branch}:{branch}
git diff --stat {base_short} {branch}      # the series' commits
```

On DeepSpeed's master as it is today, `git am patches/master/000[1-9]-*.patch` (after
`python -m patch_and_test.signoff patches/master`). Pull request: title `pr-title.txt`, body
`pr-body.md` (the bundle's PR.md without its title); the squash commit's message is
`squash-message.txt`.
"""
WHERE = {
    NEWEST_UPSTREAM:
    "\nThat base is not an upstream commit: it is DeepSpeed's newest release (its sdist)\n"
    "committed on a commit of master, whose tests it keeps; `python -m patch_and_test --newest-upstream`\n"
    "(zero3-sp-gradfix) builds it with this id in a clone of DeepSpeed: fetch the bundle there.\n",
}


def write(bundle: Path, series: Series, mirror: Path | None) -> list[str]:
    """Write ``<bundle>/github/``; returns notes (what could not be made here, and why)."""
    out = bundle / "github"
    out.mkdir(parents=True, exist_ok=True)
    pr = (bundle / "PR.md").read_text() if (bundle / "PR.md").exists() else ""
    (out / "pr-title.txt").write_text(title(series) + "\n")
    (out / "squash-message.txt").write_text(squash_message(series, pr))
    (out / "pr-body.md").write_text(pr_body(pr))
    if mirror is None or not mirror.exists():
        return [f"github/{BUNDLE_FILE}: not made (no DeepSpeed mirror: set DEEPSPEED_MIRROR)"]
    with tempfile.TemporaryDirectory(prefix="zero3-sp-branch.") as tmp:
        repo, head = build_branch(mirror, series, Path(tmp))
        git(repo, "bundle", "create", str(out / BUNDLE_FILE), BRANCH, f"^{series.base_commit}")
    (out / "README.md").write_text(
        README.format(bundle=BUNDLE_FILE, branch=BRANCH, version=series.version, base=series.base_commit,
                      base_short=series.base_commit[:12], base_ref=series.base_ref, head=head,
                      where=WHERE.get(series.base_ref, "\n")))
    return []


def verify(bundle: Path, series: Series, mirror: Path | None) -> tuple[list[str], list[str]]:
    """(problems, notes) of ``<bundle>/github/``."""
    out = bundle / "github"
    problems: list[str] = []
    pr = (bundle / "PR.md").read_text() if (bundle / "PR.md").exists() else ""
    expected = {
        "pr-title.txt": title(series) + "\n",
        "squash-message.txt": squash_message(series, pr),
        "pr-body.md": pr_body(pr)
    }
    for name, text in expected.items():
        path = out / name
        if not path.exists():
            problems.append(f"github/{name}: missing")
        elif path.read_text() != text:
            problems.append(f"github/{name}: differs from what the series and PR.md give")
    branch_file = out / BUNDLE_FILE
    if not branch_file.exists():
        return problems, [f"github/{BUNDLE_FILE}: absent (the bundle was built without a DeepSpeed mirror)"]
    if mirror is None or not mirror.exists():
        return problems, [f"github/{BUNDLE_FILE}: not checked (no DeepSpeed mirror: set DEEPSPEED_MIRROR)"]
    return problems + check_branch(branch_file, series, mirror), []


def check_branch(branch_file: Path, series: Series, mirror: Path) -> list[str]:
    """Fetch the bundle into a clone at the base; compare with ``git am`` of the series there."""
    with tempfile.TemporaryDirectory(prefix="zero3-sp-branch-check.") as tmp:
        tree = from_series_base(series, mirror, branch="zero3-sp-am", cache=Path(tmp) / "cache")
        try:
            repo = tree.path
            checked = git(repo, "bundle", "verify", str(branch_file), check=False)
            if checked.returncode != 0:
                return [f"github/{BUNDLE_FILE}: git bundle verify failed: {checked.stderr.strip()[-200:]}"]
            git(repo, "fetch", "-q", str(branch_file), f"{BRANCH}:refs/heads/{BRANCH}")
            am = apply_series(repo, series)
            problems = []
            # The clone's base drops the blobs the mirror lacks (never touched by the series): the
            # trees may differ only there, and the series' diffs must be the same bytes.
            dropped = set(tree.dropped_paths)
            differ = git(repo, "diff", "--name-only", am.head, BRANCH).stdout.split()
            stray = [p for p in differ if not any(p == d or p.startswith(d.rstrip("/") + "/") for d in dropped)]
            if stray:
                problems.append(f"github/{BUNDLE_FILE}: its tree differs from git am of the series in {stray[:3]}")
            ours = git(repo, "diff", "--binary", series.base_commit, BRANCH).stdout
            theirs = git(repo, "diff", "--binary", am.base, am.head).stdout
            if ours != theirs:
                problems.append(f"github/{BUNDLE_FILE}: its diff from the base differs from git am of the series")
            subjects = git(repo, "log", "--format=%s", f"{series.base_commit}..{BRANCH}").stdout.splitlines()
            if subjects[::-1] != [patch_subject(p.path) for p in series.patches]:
                problems.append(f"github/{BUNDLE_FILE}: its commits are not the series' ({subjects})")
            return problems
        finally:
            tree.release()
