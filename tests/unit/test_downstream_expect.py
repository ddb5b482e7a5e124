"""The downstream rule (repro.downstream.expect): classification, gates, expected ratios; the report."""

from __future__ import annotations

import pytest

from repro.downstream.expect import ClientKind, classify, compensates, expected_ratio, mis_scaled
from repro.downstream.report import ClientRow, DownstreamReport
from repro.harness import scales

# Shapes of the clients' code, reduced to what classify() reads (the real sources are read at run time).
ALLGATHER_SRC = "losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)"
TF525_SRC = ('deepspeed_version = version.parse(importlib.metadata.version("deepspeed"))\n'
             'if is_deepspeed_zero3_enabled() and deepspeed_version < version.parse("0.20.2"):\n'
             '    local_sum = local_sum * pc.sp_size')
TF525_PATCHED_SRC = ('if is_deepspeed_zero3_enabled() and not deepspeed_zero3_sums_sp_gradients():\n'
                     '    local_sum = local_sum * pc.sp_size\n'
                     'def deepspeed_zero3_sums_sp_gradients():\n'
                     '    if getattr(stage3, "ZERO3_SP_GRADIENTS_SUMMED", False): return True\n'
                     '    return version.parse(v) >= version.parse("0.20.2")')
OWN_SHARE_SRC = "share = loss * good / total"

ALLGATHER = ClientKind("allgather", "none")
TF525 = ClientKind("own_share", "version", "0.20.2")
TF525_PATCHED = ClientKind("own_share", "marker-or-version", "0.20.2")


def test_classify_reads_the_recipe_and_the_gate():
    assert classify(ALLGATHER_SRC) == ALLGATHER
    assert classify(TF525_SRC) == TF525
    assert classify(TF525_PATCHED_SRC) == TF525_PATCHED
    assert classify(OWN_SHARE_SRC) == ClientKind("own_share", "none")


@pytest.mark.parametrize(
    "client, version, marker, want",
    [
        (TF525, "0.19.8", False, True),
        (TF525, "0.19.8", True, True),  # stock 5.25 does not read the marker
        (TF525, "0.19.6+abc", True, True),
        (TF525, "0.20.2.dev0", True, True),
        (TF525, "0.20.2", False, False),
        (TF525_PATCHED, "0.19.8", False, True),
        (TF525_PATCHED, "0.19.8", True, False),
        (TF525_PATCHED, "0.20.2", False, False),
        (ALLGATHER, "0.19.8", False, False),
    ])
def test_compensates(client, version, marker, want):
    assert compensates(client, version, marker) is want


# The acceptance table of the issue (sp=2), each cell from the one rule.
@pytest.mark.parametrize(
    "client, fixed, marker, z2, z3",
    [
        (TF525, False, False, 1.0, 1.0),  # unpatched 0.19.8
        (ALLGATHER, False, False, 2.0, 1.0),  # 5.24
        (TF525, True, True, 1.0, 2.0),  # patched: 5.25 still multiplies
        (ALLGATHER, True, True, 2.0, 2.0),
        (TF525_PATCHED, False, False, 1.0, 1.0),  # the transformers patch, both ways
        (TF525_PATCHED, True, True, 1.0, 1.0),
        (TF525_PATCHED, True, False, 1.0, 2.0),  # a fixed build without the marker: the patch cannot tell
        (ClientKind("own_share", "none"), False, False, 1.0, 0.5),
        (ClientKind("own_share", "none"), True, True, 1.0, 1.0),
    ])
def test_expected_ratio_table(client, fixed, marker, z2, z3):
    assert expected_ratio(client, 2, 2, fixed, "0.19.8", marker) == z2
    assert expected_ratio(client, 3, 2, fixed, "0.19.8", marker) == z3


def test_expected_ratio_scales_with_sp():
    assert expected_ratio(ALLGATHER, 2, 4, True, "0.19.8", True) == 4.0
    assert expected_ratio(ClientKind("own_share", "none"), 3, 4, False, "0.19.8", False) == 0.25


def test_expected_ratio_rejects_bad_input():
    with pytest.raises(ValueError):
        expected_ratio(ClientKind("nope", "none"), 2, 2, True, "0.19.8", True)
    with pytest.raises(ValueError):
        expected_ratio(ALLGATHER, 1, 2, True, "0.19.8", True)
    with pytest.raises(ValueError):
        compensates(ClientKind("own_share", "bogus"), "0.19.8", False)


def test_mis_scaled():
    assert not mis_scaled(1.0) and mis_scaled(2.0) and mis_scaled(0.5)


def _row(**kw):
    base = dict(client="transformers", client_version="5.25.0", function="f", stage=3, status="measured",
                kind="own_share", gate="version", gate_version="0.20.2", ratio=2.0, residual=1e-8, expected=2.0,
                matches_rule=True)
    return ClientRow(**{**base, **kw})


def _report(rows, expect="fixed"):
    return DownstreamReport(script="downstream_clients", deepspeed_version="0.19.8", deepspeed_fixed=True, marker=True,
                            torch_version="2.13.0", backend="gloo", device="cpu", launcher="local", world_size=2, sp=2,
                            dp=1, expect=expect, rows=rows)


def test_row_verdicts():
    assert _row().verdict == "mis-scaled x2 (as the rule predicts)"
    assert _row(expected=0.5).verdict == "mis-scaled x1/2 (as the rule predicts)"
    assert _row(ratio=1.0, expected=1.0).verdict == "true gradient (as the rule predicts)"
    assert _row(matches_rule=False, expected=1.0).verdict == "MISMATCH: rule says 1"
    assert _row(status="not-applicable", note="why").verdict == "not applicable: why"
    assert _row(status="error", note="ImportError: x").verdict == "error: ImportError: x"


def test_report_exit_codes_and_round_trip():
    assert _report([_row()]).exit_code == 0
    assert _report([_row(matches_rule=False)]).exit_code == 1
    assert _report([_row(), _row(status="error", note="x")]).exit_code == 2
    assert _report([_row(status="not-applicable", note="x", stage=None)]).exit_code == 77
    rep = _report([_row(), _row(status="not-applicable", note="why", stage=None)])
    data = rep.to_dict()
    assert data["rows"][0]["verdict"].startswith("mis-scaled")
    assert DownstreamReport.from_dict(data).rows == rep.rows
    assert data["holds"] and data["exit_code"] == 0 and data["schema"] == DownstreamReport.SCHEMA


def test_report_loads_a_verdict_of_the_old_format():
    data = _report([_row()]).to_dict()
    data["rows"][0]["verdict"] = "mis-scaled x2.0 (as the rule predicts)"  # before scales.label
    assert DownstreamReport.from_dict(data).rows[0].verdict == "mis-scaled x2 (as the rule predicts)"
    data["exit_code"] = 1
    with pytest.raises(ValueError):  # a stored verdict the rows contradict
        DownstreamReport.from_dict(data)


def test_table_shows_the_rule_as_a_label():
    text = _report([_row(), _row(status="not-applicable", note="why", stage=None, expected=None)]).table()
    assert "mis-scaled x2 (as the rule predicts)" in text and "not applicable: why" in text
    assert "HOLDS (exit 0)" in text


# The rule as it was written before it took repro.harness.scales: m * r.
def _old_rule(client, stage, sp, fixed, version, marker):
    from fractions import Fraction

    if client.kind == "allgather":
        m = Fraction(sp)
    else:
        m = Fraction(sp) if stage == 3 and compensates(client, version, marker) else Fraction(1)
    return float(m * (Fraction(1, sp) if stage == 3 and not fixed else Fraction(1)))


@pytest.mark.parametrize("client", [ALLGATHER, TF525, TF525_PATCHED, ClientKind("own_share", "none")])
def test_the_rule_is_the_shared_one(client):
    for stage in (2, 3):
        for sp in range(1, 5):
            for fixed in (False, True):
                for version in ("0.19.8", "0.20.2"):
                    for marker in (False, True):
                        got = expected_ratio(client, stage, sp, fixed, version, marker)
                        assert got == _old_rule(client, stage, sp, fixed, version, marker)
                        assert scales.label(got) in {"1", str(sp), f"1/{sp}"}


def test_module_level_recipe_says_why_a_script_is_not_a_function():
    from repro.downstream.measure import module_level_recipe

    script = ("import torch\n"
              "def collate_fn(b):\n    return b\n"
              "for batch in dl:\n"
              "    losses = torch.distributed.nn.functional.all_gather(loss, group=g)\n")
    why = module_level_recipe(script)
    assert "module-level code" in why and "collate_fn" in why
    inside = "def loss(x):\n    return torch.distributed.nn.functional.all_gather(x)\n"
    assert module_level_recipe(inside) == ""


def test_client_source_follows_same_module_helpers():
    from repro.downstream.measure import client_source

    assert "ZERO3_SP_GRADIENTS_SUMMED" in client_source(_loss_with_helper)
    assert classify(client_source(_loss_with_helper)) == TF525_PATCHED


def _marker_helper():
    if getattr(object, "ZERO3_SP_GRADIENTS_SUMMED", False):
        return True
    return version.parse("1") >= version.parse("0.20.2")  # noqa: F821 - never called, only read


def _loss_with_helper(pc, local_sum):
    if not _marker_helper():
        local_sum = local_sum * pc.sp_size
    return local_sum


# axolotl 0.21's AxolotlTrainer.compute_loss on the sp path, reduced to what classify() reads.
AXOLOTL_CALLER = ("result = super().compute_loss(model, inputs, return_outputs=return_outputs)\n"
                  "loss = loss / self.accelerator.parallelism_config.sp_size")
TRL_CALLER = 'loss, outputs = super().compute_loss(model, {**inputs, "fused_lm_head": True}, return_outputs=True)'
AXOLOTL = ClientKind("allgather", "none", divides_by_sp=True)  # on its pinned transformers 5.20.1


def test_recipe_factor_of_a_caller_that_divides_by_sp():
    from fractions import Fraction

    assert scales.recipe_factor("allgather", 2, divides_by_sp=True) == 1
    assert scales.recipe_factor("own_share", 4, divides_by_sp=True) == Fraction(1, 4)
    assert scales.recipe_factor("own_share", 2, compensates=True, divides_by_sp=True) == 1
    assert scales.expected_scale(scales.ReducePath.AVG_SCATTER, 2, "buggy", "allgather", divides_by_sp=True) == 0.5


def test_classify_reads_a_division_by_sp_in_the_caller():
    assert classify(ALLGATHER_SRC, AXOLOTL_CALLER) == AXOLOTL
    assert classify(TF525_SRC, AXOLOTL_CALLER) == ClientKind("own_share", "version", "0.20.2", True)
    assert classify(ALLGATHER_SRC, TRL_CALLER) == ALLGATHER  # trl hands the loss on unchanged
    assert classify(ALLGATHER_SRC + "\nloss /= pc.sp_size") == AXOLOTL  # in the loss function itself
    assert not classify(ALLGATHER_SRC, "loss = total_loss / total_good_tokens").divides_by_sp


# axolotl divides transformers' loss by sp: the true gradient on ZeRO-2, 1/sp on unpatched ZeRO-3, 1 with the fix.
@pytest.mark.parametrize(
    "client, fixed, marker, z2, z3",
    [
        (AXOLOTL, False, False, 1.0, 0.5),
        (AXOLOTL, True, True, 1.0, 1.0),
        (ClientKind("own_share", "version", "0.20.2", True), False, False, 0.5, 0.5),  # axolotl on transformers 5.25
        (ClientKind("own_share", "version", "0.20.2", True), True, True, 0.5, 1.0),
    ])
def test_expected_ratio_of_a_client_that_divides_by_sp(client, fixed, marker, z2, z3):
    assert expected_ratio(client, 2, 2, fixed, "0.19.8", marker) == z2
    assert expected_ratio(client, 3, 2, fixed, "0.19.8", marker) == z3


def test_codes_called_sees_the_wrapped_function():
    from repro.downstream.measure import codes_called

    def wrapped():
        return _marker_helper  # never called: the function object itself

    def entry():
        return wrapped()

    def other():
        return 1

    codes = {"wrapped": wrapped.__code__}
    assert codes_called(entry, codes) == (_marker_helper, ["wrapped"])
    assert codes_called(other, codes) == (1, [])


def _wrapping_client(reaches):
    from repro.downstream.measure import Client

    return Client("axolotl", "0.21.0", "axolotl...compute_loss", None, AXOLOTL, reaches=reaches)


def test_a_wrapping_entry_that_did_not_reach_its_loss_function_cannot_match():
    import torch

    from repro.alst.measure import PARAMS
    from repro.downstream.measure import measured_row

    grads = {p: torch.full((3, ), 2.0) for p in PARAMS}
    client = _wrapping_client(("tf.loss", _marker_helper.__code__))
    # unpatched ZeRO-3: the rule says 1/2 for axolotl; these gradients are half the baseline
    half = {p: g / 2 for p, g in grads.items()}
    row = measured_row(client, 3, half, grads, 2, False, "0.19.8", False, ["tf.loss"])
    assert row.matches_rule and row.reached == "tf.loss" and row.divides_by_sp and row.expected == 0.5
    row = measured_row(client, 3, half, grads, 2, False, "0.19.8", False, [])
    assert not row.matches_rule and row.reached is None and "did not reach tf.loss" in row.note
