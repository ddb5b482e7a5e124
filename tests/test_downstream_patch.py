"""The proposed transformers patch (patches/downstream/transformers) applies to transformers' PyPI sdists.

Downloads from PyPI (network), once per cache: the 5.25.0 sdist the patch is made on, and the
newest sdist when PyPI has a newer one (skipped, with the reason, while 5.25.0 is the newest; which
is newest is asked each run). Cheap: only the files the patch changes are unpacked. ``patch -p1``
as a user or a packager would, with exact context; then the patched files say what the patch
promises: the marker or the version, in one helper used by the loss and by Trainer's ImportError
gate, and the new test beside transformers' ALST tests. Whether the patched client then gives the
true gradient is measured by ``tox -e downstream-tf5.25-patched`` and, with transformers' own
test, by ``patches/downstream/transformers/results/run.sh``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tarfile

import pytest

from patch_and_test.core import source
from repro.harness.env import cache_root
from tests.conftest import ROOT

pytestmark = [pytest.mark.network, pytest.mark.slow_tier]

PATCHES = sorted((ROOT / "patches" / "downstream" / "transformers").glob("*.patch"))
MADE_ON = "5.25.0"
NEW_TEST = "tests/deepspeed/test_alst_ulysses_sp_gradients.py"


def newest_transformers() -> str:
    proc = subprocess.run([*source.pip_command(), "index", "versions", "transformers"], capture_output=True, text=True)
    found = re.search(r"^transformers \(([^)]+)\)", proc.stdout, re.M)
    assert proc.returncode == 0 and found, proc.stdout + proc.stderr
    return found.group(1)


def changed_files(patches) -> set[str]:
    """The files the patches change that exist before them (``--- a/PATH``)."""
    return {m for p in patches for m in re.findall(r"^--- a/(\S+)$", p.read_text(), re.M)}


@pytest.fixture(scope="module", params=[MADE_ON, "newest"])
def sdist_tree(request, tmp_path_factory):
    version = request.param
    if version == "newest":
        version = newest_transformers()
        if version == MADE_ON:
            pytest.skip(f"transformers {MADE_ON}, the patch's base, is the newest on PyPI")
    cache = cache_root() / "sdists"
    # A release's sdist never changes on PyPI: a cached one is reused without asking pip (about 20 s).
    cached = cache / f"transformers-{version}.tar.gz"
    archive = cached if cached.is_file() else source.download_sdist(version, cache, package="transformers")
    dest = tmp_path_factory.mktemp(f"tf-{version}")
    prefix = f"transformers-{version}/"
    with tarfile.open(archive) as tar:
        wanted = [m for m in tar.getmembers() if m.name.removeprefix(prefix) in changed_files(PATCHES)]
        tar.extractall(dest, members=wanted, filter="data")
    return dest / prefix


def test_there_is_a_patch():
    assert PATCHES, "patches/downstream/transformers has no *.patch"


def test_the_patch_applies_with_patch_p1(sdist_tree):
    for patch in PATCHES:
        proc = subprocess.run(
            ["patch", "-p1", "--batch", "--forward", "-d",
             str(sdist_tree), "-i", str(patch)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, proc.stdout  # exact context
    integ = (sdist_tree / "src/transformers/integrations/deepspeed.py").read_text()
    trainer = (sdist_tree / "src/transformers/trainer.py").read_text()
    new_test = (sdist_tree / NEW_TEST).read_text()
    for text in (integ, trainer, new_test):
        ast.parse(text)
    helper = integ[integ.index("def deepspeed_zero3_sums_sp_gradients"):]
    helper = helper[:helper.index("\ndef ", 1)]
    assert '"ZERO3_SP_GRADIENTS_SUMMED"' in helper and 'version.parse("0.20.2")' in helper
    loss = integ[integ.index("def deepspeed_sp_compute_loss"):]
    assert "not deepspeed_zero3_sums_sp_gradients()" in loss and 'version.parse("0.20.2")' not in loss
    assert "not deepspeed_zero3_sums_sp_gradients()" in trainer
    assert "version.parse(deepspeed.__version__)" not in trainer
    assert "deepspeed_sp_compute_loss" in new_test and "deepspeed_zero3_sums_sp_gradients" in new_test
    # Applied twice: refused, the tree stays as it is.
    again = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "--dry-run", "-d",
         str(sdist_tree), "-i",
         str(PATCHES[0])], capture_output=True, text=True)
    assert again.returncode != 0
