"""A user's install: the wheel of this checkout needs nothing a DeepSpeed training environment lacks but PyYAML,
carries the series and the lock, and its zero3-sp doctor works from any folder without the checkout.

The wheel is built without build isolation (this environment's setuptools: no download) from a copy of the
checkout's build inputs, and unpacked rather than installed (no download of its dependencies either).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser

import pytest
from packaging.requirements import Requirement

from patch_and_test.core.install import Installer
from patch_and_test.core.series import series_for_version
from tests.conftest import ROOT, tracked_files
from tests.unit.test_front_door import WITHOUT_MAINT, doctor_without_maint

pytestmark = pytest.mark.slow_tier

BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "deepspeed-sdists.lock", "requirements/",
                "patches/", "patch_and_test/", "repro/")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("no setuptools here to build the wheel without isolation")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for path in tracked_files(*BUILD_INPUTS):
        (src / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, src / path.relative_to(ROOT))
    done = subprocess.run(Installer.find().wheel_cmd(src, out), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    built, = out.glob("zero3_sp_gradfix-*.whl")
    return zipfile.ZipFile(built)


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    return wheel.read(next(n for n in wheel.namelist() if n.endswith(f".dist-info/{name}"))).decode()


def test_the_wheel_requires_only_what_deepspeed_has_and_pyyaml(wheel):
    required = [Requirement(r) for r in Parser().parsestr(_dist_info(wheel, "METADATA")).get_all("Requires-Dist")]
    plain = {r.name.lower(): str(r.marker or "") for r in required if "extra" not in str(r.marker or "")}
    assert plain == {"packaging": "", "pydantic": "", "pyyaml": "", "tomli": 'python_version < "3.11"'}
    extras = {r.name.lower() for r in required if 'extra == "maint"' in str(r.marker)}
    assert extras == {"jinja2"}
    assert "zero3-sp = patch_and_test.cli:main" in _dist_info(wheel, "entry_points.txt")


def test_the_wheel_carries_the_series_the_lock_and_the_proposed_client_changes(wheel, manifest):
    names = set(wheel.namelist())
    assert {"patch_and_test/patches/series.toml", "patch_and_test/deepspeed-sdists.lock"} <= names
    for series in manifest.series:
        for path in (series.cover_letter, *(p.path for p in series.patches)):
            assert f"patch_and_test/patches/{path.relative_to(ROOT / 'patches').as_posix()}" in names
    downstream = tracked_files("patches/downstream/")
    assert downstream and all(f"patch_and_test/{p.relative_to(ROOT).as_posix()}" in names for p in downstream)
    assert "repro/harness/fixed.py" in names and "patch_and_test/templates/PR.md.j2" in names


@pytest.mark.parametrize("stage, code", [(3, 1), (1, 0)])
def test_the_unpacked_wheels_doctor_works_from_another_folder(wheel, tmp_path, stage, code):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("the doctor reads the installed DeepSpeed; none here")
    site = tmp_path / "site"
    wheel.extractall(site)
    done = doctor_without_maint({"zero_optimization": {
        "stage": stage
    }}, tmp_path, cwd=tmp_path, env={
        **os.environ, "PYTHONPATH": str(site)
    })
    assert done.returncode == code, done.stderr
    maint = subprocess.run([sys.executable, "-c", WITHOUT_MAINT, "docs", "--check"], capture_output=True, text=True,
                           cwd=tmp_path, env={
                               **os.environ, "PYTHONPATH": str(site)
                           }, timeout=120)
    assert maint.returncode == 2 and "runs in a checkout of zero3-sp-gradfix" in maint.stderr
    if code == 1:  # the series for this DeepSpeed, and where the installed copy of its patches is
        series = series_for_version(importlib.metadata.version("deepspeed"))
        assert f"(v{series.version}, {site / 'patch_and_test' / 'patches' / series.name}/, for" in done.stdout
