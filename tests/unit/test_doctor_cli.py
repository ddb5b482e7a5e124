"""``zero3-sp doctor``: its exit codes, on real DeepSpeed code.

The DeepSpeed trees are the installed DeepSpeed's own ``stage3.py``, ``runtime/zero/config.py`` and
``runtime/constants.py``, copied as they are (unpatched) and with the series' patch 0001 applied by
``git apply`` (patched), read through ``--deepspeed``; ``--recipe`` stands for the loss code, so the
run does not depend on which clients are installed here (their reading is the client check's).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.doctor import read
from patch_and_test.core.series import series_for_version
from tests.conftest import ROOT


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "patch_and_test", "doctor", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def write(path: Path, config: dict | str) -> Path:
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


@pytest.mark.parametrize("make, args, message", [
    (None, ["--sp", "2"], "no such DeepSpeed config"),
    ('{"zero_optimization": {"stage": 3,', ["--sp", "2"], "is not valid JSON"),
    ({
        "zero_optimization": {
            "stage": 3
        }
    }, ["--sp", "0"], "--sp must be >= 1, got 0"),
    ({
        "zero_optimization": {
            "stage": 3
        }
    }, [], "pass --sp"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, args, message):
    config = tmp_path / "ds_config.json"
    if make is not None:
        write(config, make)
    result = doctor("--ds-config", str(config), *args)
    assert result.returncode == 2, result
    assert result.stdout == "" and result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert message in result.stderr


def test_a_tree_that_is_not_deepspeed_is_exit_2(tmp_path):
    config = write(tmp_path / "c.json", {"zero_optimization": {"stage": 3}})
    result = doctor("--ds-config", str(config), "--sp", "2", "--recipe", "none", "--deepspeed", str(tmp_path))
    assert result.returncode == 2 and "is not a DeepSpeed tree" in result.stderr


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    """{"unpatched": tree, "patched": tree} from the installed DeepSpeed's own files."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.origin:
        pytest.skip("deepspeed is not installed")
    package = Path(spec.origin).parent
    version = importlib.metadata.version("deepspeed")
    root = tmp_path_factory.mktemp("ds")
    out = {}
    for name in ("unpatched", "patched"):
        tree = root / name
        for relative in (read.STAGE3, read.ZERO_CONFIG, read.CONSTANTS):
            (tree / "deepspeed" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(package / relative, tree / "deepspeed" / relative)
        (tree / "version.txt").write_text(version + "\n")
        out[name] = tree
    fix = series_for_version(version).fix_patches[0].path
    applied = subprocess.run(["git", "apply", "--include=deepspeed/runtime/zero/stage3.py",
                              str(fix)], cwd=out["patched"], capture_output=True, text=True)
    if applied.returncode != 0:
        pytest.skip(f"the installed DeepSpeed {version} is already patched or differs: {applied.stderr.strip()}")
    return out


ZERO3 = {"zero_optimization": {"stage": 3, "reduce_scatter": True}}
ZERO2 = {"zero_optimization": {"stage": 2}}


@pytest.mark.parametrize(
    "tree, config, recipe, code, shown",
    [
        ("unpatched", ZERO3, "none", 1, "__avg_scatter_grads your own loss (each rank's token-weighted share) 1/2 1"),
        ("patched", ZERO3, "none", 0, "not affected"),
        ("unpatched", ZERO2, "none", 0, "not affected"),
        ("unpatched", ZERO2, "allgather", 1,
         "stage_1_and_2 your own loss (differentiable all_gather of the loss) 2 2"),
        ("unpatched", ZERO3, "allgather", 0, "before you take the fix"),  # right today, 2x with the fix
    ])
def test_exit_codes_on_real_deepspeed_code(tmp_path, trees, tree, config, recipe, code, shown):
    path = write(tmp_path / "ds_config.json", config)
    result = doctor("--ds-config", str(path), "--sp", "2", "--recipe", recipe, "--deepspeed", str(trees[tree]))
    assert result.returncode == code, result.stdout + result.stderr
    assert shown in " ".join(result.stdout.split()), result.stdout  # the table's columns, spaces folded
    if code == 1:
        assert "remedy" in result.stdout


def test_the_unpatched_remedy_names_the_series_of_this_version(tmp_path, trees):
    version = (trees["unpatched"] / "version.txt").read_text().strip()
    path = write(tmp_path / "ds_config.json", ZERO3)
    result = doctor("--ds-config", str(path), "--sp", "2", "--recipe", "none", "--deepspeed", str(trees["unpatched"]))
    assert f"needs the series {series_for_version(version).name} " in result.stdout
    assert "reduce_scatter: false, contiguous_gradients: true" in result.stdout  # the no-patch alternative


def test_sizes_decide_a_split_bucket(tmp_path, trees):
    path = write(tmp_path / "ds_config.json",
                 {"zero_optimization": {
                     "stage": 3,
                     "reduce_scatter": False,
                     "reduce_bucket_size": 16
                 }})
    common = ["--ds-config", str(path), "--sp", "2", "--recipe", "none", "--deepspeed", str(trees["unpatched"])]
    undecided = doctor(*common)
    assert undecided.returncode == 2 and "pass --model or --param-sizes" in undecided.stderr
    assert doctor(*common, "--param-sizes", "4,16").returncode == 0
    assert doctor(*common, "--param-sizes", "4,64").returncode == 1
