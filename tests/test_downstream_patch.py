"""The proposed transformers patch (patches/downstream/transformers) applies to the transformers 5.25.0 sdist.

Downloads the sdist from PyPI (network), once per cache. ``patch -p1`` as a user or a packager
would, then the two places the patch must change say what it promises: the marker first, then
the version, in one helper used by the loss and by Trainer's ImportError gate. Whether the
patched client then gives the true gradient is measured by ``tox -e downstream-tf5.25-patched``.
"""

from __future__ import annotations

import ast
import subprocess
import tarfile

import pytest

from patch_and_test import downstream, source
from tests.conftest import ROOT

pytestmark = [pytest.mark.network, pytest.mark.slow_tier]

PATCHES = sorted((ROOT / "patches" / "downstream" / "transformers").glob("*.patch"))
VERSION = "5.25.0"


@pytest.fixture(scope="module")
def sdist_tree(tmp_path_factory):
    archive = downstream.transformers_sdist(VERSION, source.cache_dir() / "sdists")
    dest = tmp_path_factory.mktemp("tf")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / f"transformers-{VERSION}"


def test_there_is_a_patch():
    assert PATCHES, "patches/downstream/transformers has no *.patch"


def test_the_patch_applies_with_patch_p1(sdist_tree):
    for patch in PATCHES:
        proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-d", str(sdist_tree), "-i", str(patch)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, proc.stdout  # exact context
    integ = (sdist_tree / "src/transformers/integrations/deepspeed.py").read_text()
    trainer = (sdist_tree / "src/transformers/trainer.py").read_text()
    ast.parse(integ), ast.parse(trainer)
    helper = integ[integ.index("def deepspeed_zero3_sums_sp_gradients"):]
    helper = helper[:helper.index("\ndef ", 1)]
    assert helper.index('"ZERO3_SP_GRADIENTS_SUMMED"') < helper.index('version.parse("0.20.2")')
    loss = integ[integ.index("def deepspeed_sp_compute_loss"):]
    assert "not deepspeed_zero3_sums_sp_gradients()" in loss and 'version.parse("0.20.2")' not in loss
    assert "not deepspeed_zero3_sums_sp_gradients()" in trainer
    assert "version.parse(deepspeed.__version__)" not in trainer
    # Applied twice: refused, the tree stays as it is.
    again = subprocess.run(["patch", "-p1", "--batch", "--forward", "--dry-run", "-d", str(sdist_tree), "-i",
                            str(PATCHES[0])], capture_output=True, text=True)
    assert again.returncode != 0
