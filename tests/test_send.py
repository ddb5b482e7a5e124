"""``zero3-sp send`` with real git: on a small synthetic DeepSpeed-shaped checkout whose history lacks a blob (as
the mirror's does), end to end in seconds (its "DeepSpeed tests" are two tiny files); on the real mirror, the
series it picks for master.

The synthetic manifest has a ``master`` series that does not apply and a backport that does, with a marker
patch: send must take the backport without its marker, sign every commit as the sender, run the regression
test without and with the fix, and leave the sender's checkout as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from patch_and_test.core import errors, source
from patch_and_test.core.series import load_manifest, tree_has_fix
from patch_and_test.review import send as send_mod
from patch_and_test.upstream import suite as upstream_suite
from tests.conftest import repo_state
from tests.test_git_synthetic import FIXED, STAGE3, make_upstream, run, write

pytestmark = pytest.mark.git_tools

SENDER = ("Bar Sender", "bar@example.org")
PLACEHOLDER = {
    "GIT_AUTHOR_NAME": "Your Name",
    "GIT_AUTHOR_EMAIL": "you@example.invalid",
    "GIT_COMMITTER_NAME": "Your Name",
    "GIT_COMMITTER_EMAIL": "you@example.invalid"
}
# The regression test: it reads stage3.py from its tree, so it fails without the fix and passes with it.
REGRESSION_TEST = '''from pathlib import Path


def test():
    pass


class TestZero3SequenceParallelGradientScale:

    def test(self):
        stage3 = Path(__file__).parents[4] / "deepspeed/runtime/zero/stage3.py"
        assert "sequence_parallel_size" in stage3.read_text()
'''
SERIES = """
[[series]]
name = "{name}"
version = {version}
min_version = "{low}"
below_version = "{below}"
base_commit = "{commit}"
base_ref = "{ref}"
patches = [{patches}]
"""


def manifest_text(commit: str) -> str:
    """``master`` (fix, test) and one backport (fix, test, marker), both on ``commit``."""
    roles = [("0001-fix.patch", "fix"), ("0002-test.patch", "test"), ("0003-marker.patch", "marker")]
    listed = [", ".join(f'{{ file = "{f}", role = "{r}" }}' for f, r in roles[:n]) for n in (2, 3)]
    master = SERIES.format(name="master", version=3, low="0.19.9", below="0.21.0", commit=commit,
                           ref="newest-upstream", patches=listed[0])
    backport = SERIES.format(name="v0.19.3-v0.19.7", version=5, low="0.19.3", below="0.19.8", commit=commit,
                             ref="master", patches=listed[1])
    return "schema = 1\n" + master + backport


def _git_env(extra: dict) -> dict:
    return {**os.environ, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", **extra}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(the sender's checkout, the manifest): upstream with a missing blob, the series made on it."""
    monkeypatch.setenv("ZERO3_SP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(upstream_suite, "hub_env", lambda: {})  # no ALST test here: no hub model to lay out
    upstream, commit = make_upstream(tmp_path / "upstream", "tests/unit/v1/zero/test_zero.py")

    # The series, as the package keeps it: the placeholder authors and signs it.
    dev = tmp_path / "dev"
    source.clone_shared(upstream, dev)
    source.prepare_working_copy(dev, commit, "work")
    for rel, text, subject in (("deepspeed/runtime/zero/stage3.py", FIXED,
                                "Scale by sp"), ("tests/unit/v1/zero/test_zero.py", REGRESSION_TEST, "Test sp"),
                               ("deepspeed/runtime/zero/stage3.py", FIXED + "ZERO3_SP_GRADIENTS_SUMMED = True\n",
                                "Mark it")):
        write(dev, rel, text)
        subprocess.run(["git", "-C", str(dev), "commit", "-q", "-a", "-s", "-m", subject], check=True,
                       env=_git_env(PLACEHOLDER))
    backport = tmp_path / "patches" / "v0.19.3-v0.19.7"
    run(dev, "format-patch", "-q", "-o", str(backport), "work~3..work")
    names = ("0001-fix.patch", "0002-test.patch", "0003-marker.patch")
    for path, name in zip(sorted(backport.glob("*.patch")), names):
        path.rename(backport / name)
    master = tmp_path / "patches" / "master"
    master.mkdir()
    for name in ("0001-fix.patch", "0002-test.patch"):  # made on other code: its fix's context is not there
        text = (backport / name).read_text()
        (master / name).write_text(text.replace("    def __avg_scatter_grads", "    def __avg_scatter_gradients"))
    (tmp_path / "patches" / "series.toml").write_text(manifest_text(commit))
    manifest = load_manifest(tmp_path / "patches" / "series.toml")
    monkeypatch.setattr(send_mod, "load_manifest", lambda: manifest)

    # The sender's checkout: a clone of upstream, sparse where the blob is missing (no local commit), its identity.
    user = tmp_path / "DeepSpeed"
    run(tmp_path, "clone", "-q", "--no-checkout", str(upstream), str(user))
    run(user, "sparse-checkout", "set", "--no-cone", "/*", "!/blogs/")
    run(user, "checkout", "-q", "master")
    run(user, "config", "user.name", SENDER[0])
    run(user, "config", "user.email", SENDER[1])
    return user, commit


def commit_all(user: Path, message: str) -> None:
    """A commit in the sender's checkout: git needs the missing blob to write the tree, so it is put back first."""
    run(user, "hash-object", "-w", "--stdin", input="a large image\n")
    run(user, "commit", "-q", "-a", "-m", message)


def test_candidates_are_master_then_the_backports_newest_first_none_with_its_marker():
    found = send_mod.candidates(load_manifest())
    assert found[0].name == "master" and [s.name for s in found[1:3]] == ["v0.19.8", "v0.19.3-v0.19.7"]
    assert [s.min_version for s in found[1:]] == sorted((s.min_version for s in found[1:]), reverse=True)
    assert all(p.role != "marker" for s in found for p in s.patches)
    assert [p.role for p in found[2].patches] == ["fix", "test", "companion"]


def test_send_makes_the_signed_branch_runs_the_tests_and_leaves_the_checkout_as_it_was(world, tmp_path, capsys):
    user, commit = world
    before = repo_state(user)
    out = tmp_path / "out"
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    repo = out / "DeepSpeed"
    assert lines[-3:] == [f"repo: {repo}", "branch: zero3-sp-grad-scale", f"body: {out / 'pr-body.md'}"]
    assert repo_state(user) == before  # HEAD, branch, refs, index bytes, status, files, objects

    # The backport without its marker, on the checkout's HEAD: the branch holds the series' commits only.
    log = run(repo, "log", "--format=%an <%ae>|%cn <%ce>|%(trailers:key=Signed-off-by,valueonly,separator=%x2C)|%s",
              f"{commit}..zero3-sp-grad-scale").splitlines()
    assert log == [
        f"Bar Sender <bar@example.org>|Bar Sender <bar@example.org>|Bar Sender <bar@example.org>|{s}"
        for s in ("Test sp", "Scale by sp")
    ]
    assert run(repo, "rev-parse", "zero3-sp-grad-scale~2").strip() == commit
    assert run(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/zero3-sp-grad-scale"
    assert tree_has_fix(repo) and "ZERO3_SP_GRADIENTS_SUMMED" not in (repo / source.STAGE3).read_text()
    assert sorted(p.name
                  for p in (out / "patches" / "v0.19.3-v0.19.7").iterdir()) == ["0001-fix.patch", "0002-test.patch"]
    assert not (repo / "blogs").exists()  # left out of the work tree, not dropped in a commit

    # The body: the sender signs it; the regression test failed without the fix and passes with it.
    body = (out / "pr-body.md").read_text()
    assert f"On `{commit}` (version.txt 0.19.6)" in body
    assert "`python -m pytest unit/v1/zero/test_zero.py::TestZero3SequenceParallelGradientScale`: without the " \
        "fix (this PR's test commit alone) 1 failed; with this PR 1 passed." in body
    assert body.rstrip().endswith("Signed-off-by: Bar Sender <bar@example.org>")
    assert "+unknown" not in body and "not available to us" not in body and "example.invalid" not in body
    assert (out / "pr-title.txt").read_text().startswith("Fix ZeRO-3 gradients")
    record = json.loads((out / "results" / "affected.json").read_text())
    assert (record["series"],
            record["series_version"]) == ("v0.19.3-v0.19.7",
                                          send_mod.load_manifest().by_name("v0.19.3-v0.19.7").version)

    # Again into the same folder: replaced, same outcome.
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(out)]) == 0
    assert repo_state(user) == before


def test_no_series_applies_names_the_patch_and_hunk_and_how_to_reroll(world, tmp_path, capsys):
    user, _ = world
    write(user, "deepspeed/runtime/zero/stage3.py", STAGE3.replace("return grad_partitions_for_rank", "return []"))
    commit_all(user, "upstream moved on")
    before = repo_state(user)
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: patches/master: 0001-fix.patch does not apply to ")
    assert "deepspeed/runtime/zero/stage3.py" in err[0] and "v0.19.3-v0.19.7: 0001-fix.patch" in err[0]
    assert err[1].startswith("reroll: ") and "zero3-sp reroll" in err[1] and "-v 4" in err[1]
    assert repo_state(user) == before


@pytest.mark.parametrize("identity", [
    "Your Name <you@example.invalid>", "Bar Sender <bar@example.invalid>", "Bar Sender <bar@lab.INVALID>",
    "bar@example.org"
])
def test_an_identity_that_cannot_sign_is_one_line_and_exit_2_before_any_work(world, tmp_path, capsys, identity):
    user, _ = world
    before = repo_state(user)
    assert send_mod.main(["--deepspeed-src", str(user), "--as", identity, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: ")
    assert not (tmp_path / "out").exists() and repo_state(user) == before


def test_the_checkout_s_own_identity_is_checked_too(world, tmp_path, capsys):
    user, _ = world
    run(user, "config", "user.email", "bar@example.invalid")
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(tmp_path / "out")]) == 2
    assert ".invalid" in capsys.readouterr().err
    run(user, "config", "--unset", "user.email")
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        patch.delenv("GIT_AUTHOR_EMAIL", raising=False)
        assert send_mod.main(["--deepspeed-src", str(user), "--out", str(tmp_path / "out")]) == 2
    assert "no user.name and user.email" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_refusals_before_the_tests(world, tmp_path, capsys):
    user, _ = world
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(user / "inside")]) == 2
    assert "inside the checkout" in capsys.readouterr().err
    taken = tmp_path / "taken"
    write(taken, "mine.txt", "not send's\n")
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(taken)]) == 2
    assert "not made by send" in capsys.readouterr().err and (taken / "mine.txt").exists()
    write(user, "deepspeed/runtime/zero/stage3.py", FIXED)
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(tmp_path / "o")]) == 2  # dirty
    commit_all(user, "fixed upstream")
    assert send_mod.main(["--deepspeed-src", str(user), "--out", str(tmp_path / "o")]) == 5


def test_a_regression_test_that_does_not_fail_without_the_fix_is_not_sent(world, tmp_path, monkeypatch):
    user, _ = world
    manifest = send_mod.load_manifest()
    test_patch = manifest.by_name("v0.19.3-v0.19.7").directory / "0002-test.patch"
    test_patch.write_text(test_patch.read_text().replace('+        assert "sequence_parallel_size" in',
                                                         '+        assert "grad_partitions_for_rank" in'))
    code, _, body = send_mod.send(user, SENDER, tmp_path / "out")
    assert code == errors.Exit.BUG_NOT_REPRODUCED
    assert "without the fix (this PR's test commit alone) 1 passed; with this PR 1 passed" in body.read_text()


@pytest.mark.mirror
def test_on_the_mirror_s_master_send_picks_the_loco_backport_without_its_marker(mirror, tmp_path):
    repo = tmp_path / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--shared", str(mirror), str(repo)], check=True)
    master = run(repo, "rev-parse", "master").strip()
    chosen = send_mod.choose(repo, master, send_mod.candidates(load_manifest()), tmp_path / "scratch")
    assert chosen.name == "v0.19.3-v0.19.7" and [p.role for p in chosen.patches] == ["fix", "test", "companion"]
    with pytest.raises(errors.SeriesDoesNotApply, match=r"^patches/master: 0001-.* does not apply to edaa72212672"):
        send_mod.choose(repo, master, send_mod.candidates(load_manifest())[:2], tmp_path / "scratch2")


def test_a_commit_that_is_not_its_patch_or_not_git_am_s_is_caught(world, tmp_path):
    from patch_and_test.core.series import commit_patches, differences_from_git_am, differences_from_patches

    user, commit = world
    backport = send_mod.load_manifest().by_name("v0.19.3-v0.19.7")
    patches = [p.path for p in backport.patches[:2]]
    good = commit_patches(user, commit, patches, tmp_path / "good")
    assert differences_from_patches(user, good, patches) == []
    other = tmp_path / "0002-test.patch"
    other.write_text(patches[1].read_text().replace("+        assert ", "+        assert not "))
    bad = commit_patches(user, commit, [patches[0], other], tmp_path / "bad")
    assert differences_from_patches(user, bad, patches) == ["commit 2: its diff is not 0002-test.patch's"]
    problems = differences_from_git_am(user, commit, bad, commit, good)
    assert problems == [
        "commit 2: its tree differs from git am's in ['tests/unit/v1/zero/test_zero.py']",
        "commit 2: its diff from its parent differs from git am's"
    ]
    assert differences_from_git_am(user, commit, bad[:1], commit, good)[0].startswith("differs from git am: 1 commits")
