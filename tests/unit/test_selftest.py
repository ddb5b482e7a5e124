"""The test tiers: which pytest arguments each release and tier gets (patch_and_test/tools/selftest.py)."""

import pytest


def test_selftest_tiers_split_the_suite_without_gaps():
    from patch_and_test.core.source import newest_locked
    from patch_and_test.tools.selftest import OLDER_FAST, OLDER_FAST_FILES, test_args

    new = newest_locked()
    assert test_args(new) == ["tests", "-m", "not slow_tier"]
    assert test_args(new, "slow") == ["tests", "-m", "slow_tier"]
    assert test_args(new, "all") == ["tests"]
    # On the oldest: the reproducers' 2-rank launches and the twin in the fast tier; every other version-dependent
    # test in the slow one.
    assert test_args("0.14.5") == [*OLDER_FAST_FILES, "-m", OLDER_FAST]
    # The slow tier is the fast one's complement: no test runs in neither.
    assert test_args("0.14.5", "slow") == ["tests/multiprocess", "tests/pipeline", "-m", f"not ({OLDER_FAST})"]
    with pytest.raises(ValueError):
        test_args(new, "quick")


def test_options_are_added_to_the_tier_and_paths_replace_it():
    from patch_and_test.core.source import newest_locked
    from patch_and_test.tools.selftest import pytest_command

    new = newest_locked()
    assert pytest_command(["--durations=20", "-x"], new,
                          "fast") == ["tests", "-m", "not slow_tier", "--durations=20", "-x"]
    assert pytest_command(["tests/unit", "-x"], new, "fast") == ["tests/unit", "-x"]
    assert pytest_command(["-m", "mirror"], new, "fast") == ["-m", "mirror"]


@pytest.mark.slow_tier  # three collections, about 10 s
def test_an_older_release_runs_every_version_dependent_test_in_exactly_one_tier():
    import subprocess
    import sys

    from patch_and_test.tools.selftest import test_args
    from tests.conftest import ROOT

    def collected(args: list[str]) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only", *args],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return {line for line in out.splitlines() if "::" in line}

    fast, slow = collected(test_args("0.14.5")), collected(test_args("0.14.5", "slow"))
    assert fast and slow and not fast & slow
    assert fast | slow == collected(test_args("0.14.5", "all"))
