"""The master series in the form a GitHub pull request needs: branch, title, body, squash message.

``write`` fills ``<bundle>/github/``; ``verify`` re-renders it and, with a DeepSpeed mirror, compares the branch
with a real ``git am`` of the series.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from patch_and_test.core import errors, templating
from patch_and_test.core.gitrun import git, git_out
from patch_and_test.core.series import Series, apply_series, commit_patches, differences_from_git_am
from patch_and_test.core.source import (FIXED_IDENTITY, NEWEST_UPSTREAM, build_graft, from_series_base,
                                        load_newest_upstream)

BRANCH = "zero3-sp-grad-scale"
BUNDLE_FILE = f"{BRANCH}.bundle"
# Fixed, so that the branch's commit ids do not depend on who builds it.
COMMITTER = {k: v for k, v in FIXED_IDENTITY.items() if k.startswith("GIT_COMMITTER_")}


def pr_body(pr_markdown: str) -> str:
    """PR.md without its ``# title`` line: what goes into GitHub's description box."""
    first, _, rest = pr_markdown.partition("\n")
    return rest.lstrip("\n") if first.startswith("# ") else pr_markdown


def _texts(bundle: Path, series: Series) -> dict[str, str]:
    """The title, the squash commit's message (title, then PR.md's body, ending with the sign-offs), the body."""
    pr = (bundle / "PR.md").read_text() if (bundle / "PR.md").exists() else ""
    first = pr.partition("\n")[0]
    # PR.md's title (review.pr.TITLE); a PR.md without one: the series' first patch's subject
    title = first[2:] if first.startswith("# ") else series.patches[0].subject
    body = pr_body(pr)
    return {"pr-title.txt": title + "\n", "squash-message.txt": f"{title}\n\n{body.rstrip()}\n", "pr-body.md": body}


def build_branch(mirror: Path, series: Series, work: Path) -> tuple[Path, str]:
    """(repo, head) of ``BRANCH``: the series committed on ``series.base_commit`` in a scratch clone, as
    ``git am`` would, with plumbing on an index of the base tree (no checkout: blobs a mirror lacks are fine)."""
    repo, base = work / "branch.git", mirror
    if series.base_ref == NEWEST_UPSTREAM:  # the base is the newest-upstream graft, built from the mirror
        wanted = load_newest_upstream()
        base = build_graft(wanted.release, wanted.history, mirror)[0]
    git_out(None, "clone", "-q", "--bare", "--shared", str(base), str(repo))
    if git(repo, "cat-file", "-e", f"{series.base_commit}^{{commit}}", check=False).returncode != 0:
        raise errors.BadInput(f"{series.base_commit[:12]} (the {series.name} series' base) is not in {mirror}")
    head = commit_patches(repo, series.base_commit, [p.path for p in series.patches], work, env=COMMITTER)[-1]
    git(repo, "update-ref", f"refs/heads/{BRANCH}", head)
    return repo, head


def write(bundle: Path, series: Series, mirror: Path | None) -> list[str]:
    """Write ``<bundle>/github/``; returns notes (what could not be made here, and why)."""
    out = bundle / "github"
    out.mkdir(parents=True, exist_ok=True)
    for name, text in _texts(bundle, series).items():
        (out / name).write_text(text)
    if mirror is None or not mirror.exists():
        return [f"github/{BUNDLE_FILE}: not made (no DeepSpeed mirror: set DEEPSPEED_MIRROR)"]
    with tempfile.TemporaryDirectory(prefix="zero3-sp-branch.") as tmp:
        repo, head = build_branch(mirror, series, Path(tmp))
        git(repo, "bundle", "create", str(out / BUNDLE_FILE), BRANCH, f"^{series.base_commit}")
    (out / "README.md").write_text(
        templating.render("github_README.md.j2", series=series, head=head, bundle=BUNDLE_FILE, branch=BRANCH,
                          grafted=series.base_ref == NEWEST_UPSTREAM))
    return []


def verify(bundle: Path, series: Series, mirror: Path | None) -> tuple[list[str], list[str]]:
    """(problems, notes) of ``<bundle>/github/``."""
    out = bundle / "github"
    problems: list[str] = []
    for name, text in _texts(bundle, series).items():
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
            ours = git_out(repo, "rev-list", "--reverse", f"{series.base_commit}..{BRANCH}").split()
            theirs = git_out(repo, "rev-list", "--reverse", f"{am.base}..{am.head}").split()
            # The clone's base drops the blobs the mirror lacks (never touched by the series): the trees may
            # differ only there.
            return [
                f"github/{BUNDLE_FILE}: {p}"
                for p in differences_from_git_am(repo, series.base_commit, ours, am.base, theirs, tree.dropped_paths)
            ]
        finally:
            tree.release()
