"""The newest-upstream tree's make-up and its lock entry (pure logic; the real graft is in tests/test_mirror.py)."""

from __future__ import annotations

import pytest

from patch_and_test.core import errors
from patch_and_test.core import source
from patch_and_test.core.gitrun import git, git_out


def test_the_release_replaces_the_code_folders_whole_and_the_rest_stays_masters():
    history = [("100644", "m1", "deepspeed/a.py"), ("100644", "m2", "deepspeed/dropped.py"),
               ("100644", "m3", "tests/unit/test_a.py"), ("100644", "m4", "docs/index.md"),
               ("100644", "m5", "version.txt"), ("100644", "m6", "deepspeed_extra/x.py")]
    release = [("100644", "r1", "deepspeed/a.py"), ("100644", "r2", "deepspeed/new.py"),
               ("100644", "r5", "version.txt"), ("100755", "r6", "bin/ds"),
               ("100644", "r7", "tests/unit/from_the_sdist.py")]
    entries = source.grafted_entries(history, release)
    assert entries == sorted(entries, key=lambda e: e[2])
    by_path = {path: blob for _, blob, path in entries}
    # the release's code, a file it dropped gone, one it added there
    assert by_path["deepspeed/a.py"] == "r1" and "deepspeed/dropped.py" not in by_path and by_path["deepspeed/new.py"]
    assert by_path["version.txt"] == "r5" and ("100755", "r6", "bin/ds") in entries
    # master's tests/ and docs/, whatever the release ships there; a folder that only starts like a code folder stays
    assert by_path["tests/unit/test_a.py"] == "m3" and "tests/unit/from_the_sdist.py" not in by_path
    assert by_path["docs/index.md"] == "m4" and by_path["deepspeed_extra/x.py"] == "m6"


@pytest.mark.parametrize("rel,excluded", [("deepspeed/__pycache__/a.cpython-311.pyc", True), ("csrc/x.so", True),
                                          ("deepspeed/git_version_info_installed.py", True),
                                          ("deepspeed/git_version_info.py", False), ("op_builder/cpu/comm.py", False)])
def test_build_outputs_of_the_sdist_are_left_out(rel, excluded, tmp_path):
    # The sdist's repo, whose tree the graft takes, leaves out what SDIST_EXCLUDES names (git's ignore rules).
    git_out(tmp_path, "init", "-q")
    (tmp_path / ".git" / "info" / "exclude").write_text("\n".join(source.SDIST_EXCLUDES) + "\n")
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("")
    assert (git(tmp_path, "check-ignore", "-q", rel, check=False).returncode == 0) is excluded


def test_the_lock_names_a_locked_release_and_a_full_master_commit():
    wanted = source.load_newest_upstream()
    assert wanted.release in source.load_lock() and len(wanted.history) == 40
    # the newest locked release: the graft is the newest DeepSpeed code we can read
    assert wanted.release == max(source.load_lock(), key=lambda v: tuple(map(int, v.split("."))))


def test_a_lock_without_the_table_is_a_one_line_error(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text('[sdist."0.19.8"]\nfilename = "x"\nsha256 = "y"\n')
    with pytest.raises(errors.BadInput, match=r"no \[newest-upstream\] table") as caught:
        source.load_newest_upstream(lock)
    assert "\n" not in str(caught.value)


def test_no_mirror_is_a_one_line_error_before_any_download(tmp_path):
    with pytest.raises(errors.BadInput, match="no DeepSpeed mirror") as caught:
        source.build_graft("0.19.8", "0" * 40, mirror=tmp_path / "absent", cache=tmp_path / "cache")
    assert "\n" not in str(caught.value) and not (tmp_path / "cache").exists()
