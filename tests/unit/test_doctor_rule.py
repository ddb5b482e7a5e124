"""The doctor's pure logic: the path rule, the classes, the verdict, the config reading, the code readers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from patch_and_test.doctor import read, rule
from patch_and_test.doctor.read import run_check
from patch_and_test.core.errors import BadInput
from repro.downstream.expect import VIA_CLIENTS, ClientKind
from repro.harness.scales import ReducePath, recipe_factor

UNPATCHED = rule.DeepSpeedState("0.19.8", fixed=False, marker=False)
PATCHED = UNPATCHED.with_fix()


def zero(stage=3, rs=True, cg=True, bucket=500_000_000) -> rule.ZeroSettings:
    return rule.ZeroSettings(stage=stage, reduce_scatter=rs, contiguous_gradients=cg, reduce_bucket_size=bucket)


@pytest.mark.parametrize(
    "stage, rs, cg, numel, path",
    [
        (0, True, True, 10, ReducePath.STAGE_0),
        (1, True, True, 10, ReducePath.STAGE_1_2),
        (2, False, False, 10**9, ReducePath.STAGE_1_2),
        (3, True, True, 10, ReducePath.AVG_SCATTER),  # the default: reduce_scatter
        (3, False, False, 10, ReducePath.AVG_SCATTER),  # no contiguous buffer
        (3, False, True, 16, ReducePath.CONTIGUOUS),  # fits the 16-element bucket exactly
        (3, False, True, 17, ReducePath.AVG_SCATTER),  # one element more: alone in its bucket
    ])
def test_the_path_rule(stage, rs, cg, numel, path):
    assert rule.reduce_path(zero(stage, rs, cg, 16), numel) is path


def test_the_size_decides_only_on_zero3_contiguous_without_reduce_scatter():
    assert rule.reduce_path(zero(3, False, True, 16), None) is None
    assert rule.reduce_path(zero(3, True, True, 16), None) is ReducePath.AVG_SCATTER


def test_classes_split_a_model_at_the_bucket():
    params = [("embed", 1000), ("q", 16), ("norm", 4)]
    small, large = rule.param_classes(zero(3, False, True, 16), params)
    assert (small.path, small.count, large.path, large.count) == (ReducePath.CONTIGUOUS, 2, ReducePath.AVG_SCATTER, 1)
    assert large.largest == (("embed", 1000), )
    [every] = rule.param_classes(zero(3, True, True, 16), params)
    assert every.every and every.count == 3 and every.present


@pytest.mark.parametrize("ds, recipe, stage, expected", [
    (UNPATCHED, "none", 3, 0.5),
    (PATCHED, "none", 3, 1.0),
    (UNPATCHED, "allgather", 3, 1.0),
    (PATCHED, "allgather", 3, 2.0),
    (UNPATCHED, "allgather", 2, 2.0),
    (UNPATCHED, "none", 2, 1.0),
])
def test_factors_are_the_rule(ds, recipe, stage, expected):
    path = rule.reduce_path(zero(stage), 1)
    assert rule.factor(path, 2, stage, ds, rule.own_loss(recipe)) == expected


def test_a_version_gated_client_compensates_on_a_patched_build_of_the_same_release():
    tf525 = rule.LossSource("transformers 5.25.0", ClientKind("own_share", "version", "0.20.2"), "transformers")
    path = ReducePath.AVG_SCATTER
    assert rule.factor(path, 2, 3, UNPATCHED, tf525) == 1.0
    assert rule.factor(path, 2, 3, PATCHED, tf525) == 2.0  # patched 0.19.8 is still < 0.20.2
    marker_aware = dataclasses_replace(tf525, kind=ClientKind("own_share", "marker-or-version", "0.20.2"))
    assert rule.factor(path, 2, 3, PATCHED, marker_aware) == 1.0


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_verdicts():
    source = [rule.own_loss("none")]
    affected = run_check({"zero_optimization": {"stage": 3}}, 2, UNPATCHED, source).verdict
    assert affected.affected is True and affected.exit_code == 1
    assert run_check({"zero_optimization": {"stage": 3}}, 2, PATCHED, source).verdict.exit_code == 0
    assert run_check({"zero_optimization": {"stage": 3}}, 1, UNPATCHED, source).verdict.exit_code == 0  # no sp
    mixed = {"zero_optimization": {"stage": 3, "reduce_scatter": False, "reduce_bucket_size": 16}}
    assert run_check(mixed, 2, UNPATCHED, source).verdict.exit_code == 3  # the sizes decide
    assert run_check(mixed, 2, UNPATCHED, source, [("b", 4)]).verdict.affected is False
    assert run_check(mixed, 2, UNPATCHED, source, [("b", 4), ("w", 64)]).verdict.affected is True


def test_the_workaround_puts_every_parameter_on_the_contiguous_path():
    alt, classes = rule.workaround(zero(3, True, True, 16), [("w", 64), ("b", 4)])
    assert (alt.reduce_scatter, alt.contiguous_gradients, alt.reduce_bucket_size) == (False, True, 64)
    assert {c.path for c in classes} == {ReducePath.CONTIGUOUS}


# ----------------------------------------------------------------------------- reading the config

DEFAULTS, WHERE = read.DOCUMENTED_DEFAULTS, {k: "documented" for k in read.DOCUMENTED_DEFAULTS}


def test_missing_keys_take_deepspeeds_defaults():
    z = read.zero_settings({"zero_optimization": {"stage": 3}}, DEFAULTS, WHERE, None)
    assert (z.reduce_scatter, z.contiguous_gradients, z.reduce_bucket_size) == (True, True, 500_000_000)
    assert z.where("stage") == "config" and z.where("reduce_scatter").startswith("default")
    assert read.zero_settings({}, DEFAULTS, WHERE, None).stage == 0


def test_auto_is_filled_as_hf_fills_it():
    config = {
        "zero_optimization": {
            "stage": 3,
            "reduce_scatter": False,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto"
        }
    }
    z = read.zero_settings(config, DEFAULTS, WHERE, 4096)
    assert z.reduce_bucket_size == 4096 * 4096 and "hidden_size^2" in z.where("reduce_bucket_size")
    assert read.zero_settings(config, DEFAULTS, WHERE, None).reduce_bucket_size is None
    with pytest.raises(BadInput, match="reduce_bucket_size is \"auto\""):
        run_check(config, 2, UNPATCHED, [rule.own_loss("none")])
    with pytest.raises(BadInput, match="HF's integration does not fill"):
        read.zero_settings({"zero_optimization": {"stage": "auto"}}, DEFAULTS, WHERE, None)


@pytest.mark.parametrize("config, message", [
    ({
        "zero_optimization": {
            "stage": 5
        }
    }, "0, 1, 2 or 3"),
    ({
        "zero_optimization": {
            "stage": 3,
            "reduce_scatter": "maybe"
        }
    }, "true or false"),
    ({
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 0
        }
    }, ">= 1"),
    ({
        "zero_optimization": [3]
    }, "must be an object"),
])
def test_bad_values_are_one_line_errors(config, message):
    with pytest.raises(BadInput, match=message):
        read.zero_settings(config, DEFAULTS, WHERE, None)


def test_deepspeed_spellings_are_accepted():
    z = read.zero_settings({"zero_optimization": {
        "stage": "3",
        "reduce_scatter": "false",
        "reduce_bucket_size": 5e8
    }}, DEFAULTS, WHERE, None)
    assert (z.stage, z.reduce_scatter, z.reduce_bucket_size) == (3, False, 500_000_000)
    assert read.zero_settings({"zero_optimization": True}, DEFAULTS, WHERE, None).stage == 1  # deprecated form


def test_load_config_errors(tmp_path):
    with pytest.raises(BadInput, match="no such config"):
        read.load_config(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3,')
    with pytest.raises(BadInput, match="not valid JSON"):
        read.load_config(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(BadInput, match="a JSON object is expected"):
        read.load_config(listed)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert read.load_config(good)["zero_optimization"]["stage"] == 2


def test_param_sizes():
    sizes = read.parse_param_sizes("4096, 16777216")
    assert [n for _, n in sizes.params] == [4096, 16777216]
    with pytest.raises(BadInput, match="element counts"):
        read.parse_param_sizes("4096,big")


# ----------------------------------------------------------------------------- reading DeepSpeed's code

CONFIG_SOURCE = '''
class ZeroStageEnum(int, Enum):
    disabled = 0
    weights = 3

class DeepSpeedZeroConfig(DeepSpeedConfigModel):
    stage: ZeroStageEnum = ZeroStageEnum.disabled
    contiguous_gradients: bool = True
    reduce_scatter: bool = False
    reduce_bucket_size: int = Field(pp_int(5e8), gt=0)
    zero_hpz_partition_size: int = Field(default=1, ge=0)
    zero_quantized_gradients: bool = compute_me()
'''


def test_the_defaults_reader_reads_deepspeeds_field_spellings():
    found = read.zero_config_defaults(CONFIG_SOURCE)
    assert found == {
        "stage": 0,
        "contiguous_gradients": True,
        "reduce_scatter": False,
        "reduce_bucket_size": 500_000_000,
        "zero_hpz_partition_size": 1
    }  # not a literal: left out


def test_the_marker_is_read_from_code_not_comments():
    assert read.marker_set("ZERO3_SP_GRADIENTS_SUMMED = True\n")
    assert not read.marker_set("# ZERO3_SP_GRADIENTS_SUMMED = True\nx = 1\n")
    assert not read.marker_set("ZERO3_SP_GRADIENTS_SUMMED = False\n")


def _installed_deepspeed() -> Path:
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.origin:
        pytest.skip("deepspeed is not installed")
    return Path(spec.origin).parent


def test_the_documented_defaults_are_those_of_the_installed_deepspeeds_code():
    values, where = read.read_defaults(_installed_deepspeed())
    assert all(not w.startswith("documented") for w in where.values()), where  # every key read from its code
    assert values == read.DOCUMENTED_DEFAULTS


def test_the_defaults_reader_agrees_with_deepspeeds_own_config_class():
    package = _installed_deepspeed()
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    except Exception as err:  # noqa: BLE001 - an unimportable DeepSpeed is a skip here, not a failure
        pytest.skip(f"deepspeed does not import here: {err}")
    found = read.zero_config_defaults((package / read.ZERO_CONFIG).read_text())
    own = DeepSpeedZeroConfig()
    assert found == {key: getattr(own, key) for key in found} and set(found) == set(rule.PATH_KEYS + rule.ZEROPP_KEYS)


def test_via_clients():
    trl, axolotl = VIA_CLIENTS
    kind = ClientKind("allgather", "none")
    assert trl.base == "transformers" and trl.handed_on(kind) == kind
    # axolotl divides transformers' loss by sp: on 5.20.1's all_gather that is the true gradient on ZeRO-2
    derived = axolotl.handed_on(kind)
    assert axolotl.base == "transformers" and derived.divides_by_sp and derived.kind == "allgather"
    assert recipe_factor(derived.kind, 2, divides_by_sp=derived.divides_by_sp) == 1


@pytest.mark.parametrize("trl_called", [True, False])
def test_a_client_judged_from_its_own_entry_is_not_judged_again_through_its_hand_off(monkeypatch, trl_called):
    """trl judged by calling its SFTTrainer.compute_loss is one row; only where that entry cannot be called does
    the hand-off read from its code judge it (in place of the unjudged row)."""
    share = ClientKind("own_share", "version", "0.20.2")
    found = [
        read.FoundClient("transformers", "5.25.0", "deepspeed_sp_compute_loss", share),
        read.FoundClient("trl", "1.16.0", "SFTTrainer.compute_loss", share if trl_called else None,
                         "" if trl_called else "not called")
    ]
    monkeypatch.setattr(read, "found_clients", lambda: found)
    monkeypatch.setattr(read, "dist_version", lambda dist: {"transformers": "5.25.0", "trl": "1.16.0"}.get(dist))
    monkeypatch.setattr(read, "_code", lambda relative: "sp_backend ... super().compute_loss(")
    [(trl, source)] = [(c, s) for c, s in read.installed_clients() if c.name == "trl"]
    assert source is not None and source.kind == trl.kind == share
    assert ("via" in source.label) is not trl_called


def test_auto_is_filled_as_transformers_own_code_fills_it():
    """transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize on the same config and hidden size."""
    import types

    try:
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config
        hf = HfTrainerDeepSpeedConfig(
            {"zero_optimization": {
                "stage": 3,
                "reduce_scatter": False,
                "reduce_bucket_size": "auto"
            }})
    except Exception as err:  # noqa: BLE001 - without transformers (or its accelerate) there is nothing to compare
        pytest.skip(f"transformers' DeepSpeed config cannot be built here: {err}")
    try:
        model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=48))
        hf.trainer_config_finalize(types.SimpleNamespace(get_warmup_steps=lambda steps: 0), model, 10)
        filled = hf.config["zero_optimization"]["reduce_bucket_size"]
    finally:
        unset_hf_deepspeed_config()
    ours = read.zero_settings(
        {"zero_optimization": {
            "stage": 3,
            "reduce_scatter": False,
            "reduce_bucket_size": "auto"
        }}, DEFAULTS, WHERE, read.hidden_size_of(model.config))
    assert ours.reduce_bucket_size == filled == 48 * 48


def test_own_loss_rejects_an_unknown_recipe():
    assert rule.own_loss("allgather").kind.kind == "allgather"
    with pytest.raises(ValueError, match="unknown recipe 'bogus'"):
        rule.own_loss("bogus")
