"""The test tiers: which pytest arguments each release and tier gets (patch_and_test/tools/selftest.py)."""

import pytest


def test_selftest_tiers_split_the_suite_without_gaps():
    from patch_and_test.core.source import newest_locked
    from patch_and_test.tools.selftest import OLDEST_FAST, test_args

    new = newest_locked()
    assert test_args(new) == ["tests", "-m", "not slow_tier"]
    assert test_args(new, "slow") == ["tests", "-m", "slow_tier"]
    assert test_args(new, "all") == ["tests"]
    # On the oldest: the reproducers' 2-rank launches in the fast tier; the version-dependent slow tests and the
    # 4-rank launches after.
    assert test_args("0.14.5") == [*OLDEST_FAST, "-m", "not slow_tier and not four_ranks"]
    assert test_args("0.14.5", "slow") == ["tests/multiprocess", "tests/pipeline", "-m", "slow_tier or four_ranks"]
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
