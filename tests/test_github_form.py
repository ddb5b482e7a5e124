"""The GitHub form of the master series on the real mirror: the branch fetched from the bundle is
``git am`` of the series on its base; a branch that is not gets caught."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from patch_and_test.review import github_form

pytestmark = [pytest.mark.mirror, pytest.mark.slow_tier]
PR = "# Scale it\n\n## Summary\n\nwhat and why\n\nFixes #8692\n\nSigned-off-by: Your Name <you@example.invalid>\n"


def test_branch_bundle_is_git_am_of_the_series(mirror, manifest, tmp_path):
    master = manifest.by_name("master")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "PR.md").write_text(PR)
    assert github_form.write(bundle, master, mirror) == []
    out = bundle / "github"
    assert (out / "pr-title.txt").read_text() == "Scale it\n"  # PR.md's title
    # The squash commit is the title and the body (PR.md without its title line), sign-offs last.
    assert (out / "pr-body.md").read_text() == PR.split("\n\n", 1)[1]
    squash = (out / "squash-message.txt").read_text()
    assert squash == "Scale it\n\n" + PR.split("\n\n", 1)[1]
    assert squash.rstrip().splitlines()[-1].startswith("Signed-off-by: ")
    heads = subprocess.run(
        ["git", "bundle", "list-heads", str(out / github_form.BUNDLE_FILE)], capture_output=True, text=True,
        check=True).stdout
    assert heads.strip().endswith(f"refs/heads/{github_form.BRANCH}")
    assert github_form.verify(bundle, master, mirror) == ([], [])

    # Same ids on a second build: the committer and its date are fixed.
    again = tmp_path / "again"
    again.mkdir()
    (again / "PR.md").write_text(PR)
    github_form.write(again, master, mirror)
    assert (again / "github" / "README.md").read_text() == (out / "README.md").read_text()

    # A branch without the companion commit is not the series.
    short = dataclasses.replace(master, patches=master.patches[:2])
    github_form.write(bundle, short, mirror)
    problems, _ = github_form.verify(bundle, master, mirror)
    assert any("differs from git am" in p for p in problems), problems
