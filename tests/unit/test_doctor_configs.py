"""The doctor's config readers (``read.read_config``): a DeepSpeed JSON, an accelerate config, an ArcticTraining
YAML; and, where accelerate is installed, that its own launch code hands DeepSpeed what the reader says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from patch_and_test.doctor import read, rule
from patch_and_test.core.errors import BadInput
from tests.conftest import FIXTURES

CONFIGS = FIXTURES / "doctor"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_hfs_zero3_config_leaves_reduce_scatter_to_deepspeed():
    run = read.read_config(CONFIGS / "ds_config_zero3.json")
    assert (run.kind, run.sp) == ("DeepSpeed config", None)
    assert "reduce_scatter" not in run.deepspeed["zero_optimization"]
    assert run.deepspeed["zero_optimization"]["reduce_bucket_size"] == "auto"


def test_a_deepspeed_config_states_sp_with_sequence_parallel_size(tmp_path):
    assert read.read_config(write(tmp_path / "c.json", '{"sequence_parallel_size": 4}')).sp == 4
    assert read.read_config(write(tmp_path / "c.json", '{"sequence_parallel_size": "auto"}')).sp is None


def test_accelerate_inline_keys():
    run = read.read_config(CONFIGS / "accelerate_zero3_sp2.yaml")
    assert run.deepspeed == {"zero_optimization": {"stage": 3}}
    assert (run.sp, run.sp_where) == (2, "parallelism_config_sp_size")


ACCELERATE = "distributed_type: DEEPSPEED\nnum_processes: 2\n"


@pytest.mark.parametrize(
    "text, stage, sp",
    [
        (ACCELERATE, 2, None),  # no zero_stage: DeepSpeedPlugin's 2; no parallelism_config: no sp from accelerate
        (ACCELERATE + "deepspeed_config:\n  zero_stage: 1\nparallelism_config:\n  parallelism_config_sp_size: 4\n", 1,
         4),
        (ACCELERATE + "parallelism_config:\n  parallelism_config_tp_size: 1\n", 2, 1),  # launch's sp default, 1
    ])
def test_accelerate_defaults(tmp_path, text, stage, sp):
    run = read.read_config(write(tmp_path / "a.yaml", text))
    assert (run.deepspeed["zero_optimization"]["stage"], run.sp) == (stage, sp)


def test_an_sp_backend_other_than_deepspeed_gives_deepspeed_no_sp(tmp_path):
    text = ACCELERATE + "parallelism_config:\n  parallelism_config_sp_size: 4\n  parallelism_config_sp_backend: x\n"
    run = read.read_config(write(tmp_path / "a.yaml", text))
    assert run.sp == 1 and "not deepspeed" in run.notes[-1]


def test_accelerate_config_file_is_opened_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "ds.json", json.dumps({"zero_optimization": {"stage": "auto", "reduce_scatter": False}}))
    yaml_file = write(tmp_path / "sub" / "a.yaml",
                      ACCELERATE + "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    monkeypatch.chdir(tmp_path)
    run = read.read_config(yaml_file)
    assert run.deepspeed["zero_optimization"] == {"stage": 2, "reduce_scatter": False}  # "auto": accelerate's 2
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(BadInput, match="no such config: ds.json"):
        read.read_config(yaml_file)


@pytest.mark.parametrize("text, message", [
    ("distributed_type: MULTI_GPU\n", "not DEEPSPEED"),
    (ACCELERATE + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 3\n", "refuses zero_stage"),
    (ACCELERATE + "mixed_precision: 'no'\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n", "mixed_precision"),
    (ACCELERATE + "deepspeed_config:\n  deepspeed_config_file: nozero.json\n", "needs a zero_optimization"),
    (ACCELERATE + "parallelism_config:\n  parallelism_config_sp_size: 0\n", ">= 1"),
    ("zero_optimization:\n  stage: 3\n", "neither an accelerate config"),
    ("- 1\n", "a YAML mapping is expected"),
    ("deepspeed_config:\n  zero_stage: 3\n bad: [\n", "not valid YAML"),
])
def test_bad_yaml_is_one_line(tmp_path, monkeypatch, text, message):
    write(tmp_path / "ds.json", '{"zero_optimization": {"stage": 3}}')
    write(tmp_path / "nozero.json", '{"train_micro_batch_size_per_gpu": 1}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput, match=message) as err:
        read.read_config(write(tmp_path / "c.yaml", text))
    assert "\n" not in str(err.value)


def test_arctic_training():
    run = read.read_config(CONFIGS / "arctic_zero3_sp2.yaml")
    assert (run.kind, run.sp, run.deepspeed["zero_optimization"]["stage"]) == ("ArcticTraining config", 2, 3)
    assert run.loss.kind.kind == "allgather" and run.loss.client == "arctic_training"


def test_arctic_training_defaults_and_human_values(tmp_path):
    base = "model:\n  name_or_path: m\ndata:\n  sources: [d]\n"
    run = read.read_config(write(tmp_path / "a.yaml", base))
    assert (run.sp, run.deepspeed["zero_optimization"]["stage"]) == (1, 2)  # TrainerConfig's defaults
    assert "absent" in run.sp_where
    human = base + "type: dpo\ndeepspeed:\n  zero_optimization:\n    stage: 3\n    reduce_bucket_size: 5e8\n"
    run = read.read_config(write(tmp_path / "a.yaml", human))
    assert run.deepspeed["zero_optimization"]["reduce_bucket_size"] == 5e8 and run.loss is None  # dpo: its own loss
    assert [read._human(v)
            for v in ("500M", "2^20", "1Ki", "50%", "auto", True)] == [5e8, 2**20, 1024, 0.5, "auto", True]


def test_sp_is_the_files_and_a_disagreeing_flag_is_an_error(tmp_path):
    stated = read.RunConfig("DeepSpeed config", {}, 4, "sequence_parallel_size")
    silent = read.RunConfig("DeepSpeed config", {}, None, "the config has no sequence_parallel_size")
    path = tmp_path / "c.json"
    assert read.sequence_parallel_size(stated, None, path) == 4
    assert read.sequence_parallel_size(stated, 4, path) == 4
    with pytest.raises(BadInput, match="--sp 2 disagrees with .*sequence_parallel_size is 4"):
        read.sequence_parallel_size(stated, 2, path)
    assert read.sequence_parallel_size(silent, 2, path) == 2
    with pytest.raises(BadInput, match="pass --sp N"):
        read.sequence_parallel_size(silent, None, path)


def test_the_typical_models_sizes_are_computed_from_its_shapes():
    sizes = dict(rule.TYPICAL.params())
    assert sizes["embed_tokens"] == sizes["lm_head"] == 525_336_576  # 128256 x 4096
    assert sizes["mlp.gate_proj/up_proj/down_proj"] == 58_720_256  # 4096 x 14336


# ----------------------------------------------------------------------------- accelerate's own code


def accelerate_reads(config: Path, monkeypatch) -> tuple[dict, int | None]:
    """What accelerate 1.16.0 hands DeepSpeed for ``accelerate launch --config_file config``: the DeepSpeed config
    DeepSpeedPlugin builds and the sp of the ParallelismConfig the Accelerator builds (None: it builds none)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    args, defaults, mp_from_config = _validate_launch_command(launch_command_parser().parse_args(
        ["--config_file", str(config), "train.py"]))
    assert args.use_deepspeed
    # launch_command's own lines before it calls the DeepSpeed launcher
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "PARALLELISM_CONFIG_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith(("ACCELERATE_", "PARALLELISM_CONFIG_")):
            monkeypatch.setenv(name, value)
    deepspeed = DeepSpeedPlugin().deepspeed_config
    if os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() != "true":
        return deepspeed, None
    return deepspeed, ParallelismConfig().sp_size


ACCELERATE_CASES = {
    "inline":
    "accelerate_zero3_sp2.yaml",
    "file":
    "accelerate_file_sp2.yaml",
    "defaults":
    ACCELERATE,
    "stage 1, no sp":
    ACCELERATE + "deepspeed_config:\n  zero_stage: 1\n",
    "file, stage auto":
    ACCELERATE + "deepspeed_config:\n  deepspeed_config_file: auto.json\n"
    "parallelism_config:\n  parallelism_config_sp_size: 4\n",
}


@pytest.mark.parametrize("case", ACCELERATE_CASES)
def test_accelerates_own_launch_code_agrees(tmp_path, monkeypatch, case):
    pytest.importorskip("accelerate")
    given = ACCELERATE_CASES[case]
    config = CONFIGS / given if given.endswith(".yaml") else write(tmp_path / "a.yaml", given)
    write(tmp_path / "auto.json", json.dumps({"zero_optimization": {"stage": "auto", "reduce_scatter": False}}))
    monkeypatch.chdir(CONFIGS if given.endswith(".yaml") else tmp_path)
    theirs, sp = accelerate_reads(config, monkeypatch)
    ours = read.read_config(config)
    keys = rule.PATH_KEYS + rule.ZEROPP_KEYS
    assert {k: ours.deepspeed["zero_optimization"].get(k) for k in keys} == \
        {k: theirs["zero_optimization"].get(k) for k in keys}
    assert {k: ours.deepspeed.get(k) for k in read.TOP_LEVEL} == {k: theirs.get(k) for k in read.TOP_LEVEL}
    assert ours.sp == sp


def test_accelerate_refuses_what_the_reader_refuses(tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    write(tmp_path / "ds.json", '{"zero_optimization": {"stage": 3}}')
    config = write(tmp_path / "a.yaml", ACCELERATE + "deepspeed_config:\n  deepspeed_config_file: ds.json\n"
                   "  zero_stage: 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        accelerate_reads(config, monkeypatch)
    with pytest.raises(BadInput, match="refuses zero_stage"):
        read.read_config(config)
