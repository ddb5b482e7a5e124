"""README.md's "Am I affected?" sample is the kept doctor run, whole: every line of it, in order, none cut."""

from __future__ import annotations

from tests.unit.test_readme_samples import SAMPLES, _block_starting


def test_the_readme_shows_the_kept_doctor_run_whole():
    kept = (SAMPLES / "doctor.txt").read_text().splitlines()
    assert _block_starting("DeepSpeed ") == kept
    assert any(line.startswith("loss: ") for line in kept) and kept[-1].startswith("  or, without a patch:")
