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
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.doctor import read
from patch_and_test.core.series import series_for_version
from tests.conftest import FIXTURES, ROOT


def doctor(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "patch_and_test", "doctor", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def write(path: Path, config: dict | str) -> Path:
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


@pytest.mark.parametrize("make, args, message", [
    (None, ["--sp", "2"], "no such config"),
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
    assert undecided.returncode == 3 and undecided.stderr == "", undecided
    assert "verdict: DEPENDS ON PARAMETER SIZES" in undecided.stdout
    assert doctor(*common, "--param-sizes", "4,16").returncode == 0
    assert doctor(*common, "--param-sizes", "4,64").returncode == 1


# ----------------------------------------------------------------------------- the configs users have

CONFIGS = FIXTURES / "doctor"


def one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result
    assert result.stdout == "" and result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    "config, args",
    [
        ("ds_config_zero3.json", ["--sp", "2"]),  # HF's stock ZeRO-3 config, its "auto" values; reduce_scatter unset
        ("accelerate_zero3_sp2.yaml", []),  # inline deepspeed_config keys, parallelism_config sp 2
        ("accelerate_file_sp2.yaml", []),  # deepspeed_config_file: HF's config, opened from the current directory
        ("accelerate_file_sp2.yaml", ["--sp", "2"]),  # a --sp that agrees
        ("arctic_zero3_sp2.yaml", []),
    ])
def test_the_configs_users_have_on_zero3_sp2_are_affected(trees, config, args):
    result = doctor("--config", config, *args, "--recipe", "own_share", "--deepspeed", str(trees["unpatched"]),
                    cwd=CONFIGS)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == ""
    assert "all (ZeRO-3, reduce_scatter=true) __avg_scatter_grads your own loss (each rank's token-weighted share) " \
        "1/2 1" in " ".join(result.stdout.split())
    assert "sp=2 (" in result.stdout and "verdict: AFFECTED: 1/2 x the true gradient" in result.stdout


def test_an_arctic_training_config_brings_its_trainers_loss(tmp_path, trees):
    """No --recipe: the YAML's sft trainer's loss, the all_gather recipe (arctic_training installed or not)."""
    zero3 = doctor("--config", str(CONFIGS / "arctic_zero3_sp2.yaml"), "--deepspeed", str(trees["unpatched"]))
    assert zero3.returncode == 0, zero3.stdout + zero3.stderr
    assert "before you take the fix:" in zero3.stdout and "with the fix its gradients become 2 x" in zero3.stdout
    default = write(tmp_path / "arctic.yaml", "model:\n  name_or_path: m\ndata:\n  sources: [d]\n"
                    "sequence_parallel_size: 2\n")  # no deepspeed: section: ArcticTraining's ZeRO-2
    zero2 = doctor("--config", str(default), "--deepspeed", str(trees["unpatched"]))
    assert zero2.returncode == 1, zero2.stdout + zero2.stderr
    assert "stage_1_and_2" in zero2.stdout and "verdict: AFFECTED: 2 x the true gradient" in zero2.stdout


def test_zero1_is_not_affected(tmp_path, trees):
    path = write(tmp_path / "ds_config.json", {"zero_optimization": {"stage": 1}, "sequence_parallel_size": 2})
    result = doctor("--config", str(path), "--recipe", "none", "--deepspeed", str(trees["unpatched"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: not affected" in result.stdout and result.stderr == ""


def test_reduce_scatter_false_without_sizes_depends_on_them(tmp_path, trees):
    path = write(tmp_path / "ds_config.json", {"zero_optimization": {"stage": 3, "reduce_scatter": False}})
    result = doctor("--config", str(path), "--sp", "2", "--recipe", "none", "--deepspeed", str(trees["unpatched"]))
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr == "" and "error" not in result.stdout
    [verdict] = [line for line in result.stdout.splitlines() if line.startswith("verdict:")]
    assert "more than 500,000,000 elements (reduce_bucket_size) takes __avg_scatter_grads: 1/2 x" in verdict
    assert "at most 500,000,000 takes __avg_scatter_contiguous_grads: 1 x" in verdict
    assert "embed_tokens (525,336,576 elements) and lm_head (525,336,576 elements) are above it" in verdict
    assert "mlp.gate_proj/up_proj/down_proj (58,720,256 elements) and every smaller weight are not" in verdict
    assert "remedy: DeepSpeed" in result.stdout  # the series still fixes the parameters above it


@pytest.mark.parametrize("config, text, message", [
    ("ds.json", '{"zero_optimization": {"stage": 3}, "sequence_parallel_size": 4}',
     "--sp 2 disagrees with ds.json: sequence_parallel_size is 4"),
    ("acc.yaml", "distributed_type: DEEPSPEED\nparallelism_config:\n  parallelism_config_sp_size: 4\n",
     "--sp 2 disagrees with acc.yaml: parallelism_config_sp_size is 4"),
    ("arctic.yaml", "model:\n  name_or_path: m\ndata:\n  sources: [d]\n", "--sp 2 disagrees with arctic.yaml: "
     "sequence_parallel_size (absent: ArcticTraining's default) is 1"),
])
def test_an_sp_that_disagrees_with_the_file_is_one_line_exit_2(tmp_path, trees, config, text, message):
    write(tmp_path / config, text)
    result = doctor("--config", config, "--sp", "2", "--recipe", "none", "--deepspeed", str(trees["unpatched"]),
                    cwd=tmp_path)
    one_line_error(result, message)


@pytest.mark.parametrize("text, message", [
    ("distributed_type: DEEPSPEED\n  zero_stage: [3\n", "is not valid YAML"),
    ("zero_optimization:\n  stage: 3\n", "is neither an accelerate config"),
])
def test_bad_yaml_and_yaml_of_neither_kind_are_one_line_exit_2(tmp_path, text, message):
    result = doctor("--config", str(write(tmp_path / "c.yaml", text)), "--sp", "2", "--recipe", "none")
    one_line_error(result, message)
