"""patch-and-test's client warnings (patch_and_test.downstream.clients.warnings_for): the downstream rule, per
stage."""

from __future__ import annotations

from patch_and_test.downstream.clients import FoundClient, warnings_for
from patch_and_test.job.verdict import Step, Verdict, summary_table
from repro.downstream.expect import ClientKind

TF525 = FoundClient("transformers", "5.25.0", "f", ClientKind("own_share", "version", "0.20.2"))
TF525_PATCHED = FoundClient("transformers", "5.25.0", "f", ClientKind("own_share", "marker-or-version", "0.20.2"))
TF524 = FoundClient("transformers", "5.24.0", "f", ClientKind("allgather", "none"))
NONE = FoundClient("transformers", "4.57.6", "-", None, "no sp loss code")


def stages(ws):
    return [(w.client, w.version, w.stage, w.expected) for w in ws]


def test_stock_525_on_a_patched_build_warns_for_zero3_only():
    ws = warnings_for([TF525], "0.19.8", fixed=True, marker=True)
    assert stages(ws) == [("transformers", "5.25.0", 3, 2.0)]
    assert "ZeRO-3" in ws[0].message and "2x" in ws[0].message and "0.20.2" in ws[0].message


def test_patched_525_with_the_marker_is_silent():
    assert warnings_for([TF525_PATCHED], "0.19.8", fixed=True, marker=True) == []
    # without the marker the patched client cannot tell either
    assert stages(warnings_for([TF525_PATCHED], "0.19.8", fixed=True,
                               marker=False)) == [("transformers", "5.25.0", 3, 2.0)]


def test_allgather_clients_warn_for_both_stages_and_unjudged_ones_never():
    assert stages(warnings_for([TF524, NONE], "0.19.8",
                               fixed=True, marker=True)) == [("transformers", "5.24.0", 2, 2.0),
                                                             ("transformers", "5.24.0", 3, 2.0)]


def test_the_verdict_records_and_shows_them():
    warning = warnings_for([TF525], "0.19.8", fixed=True, marker=True)[0]
    v = Verdict(env="e", source=None, series=None, deepspeed_before=None, deepspeed_after=None, backend="gloo",
                steps=[Step(name="after: downstream clients", status="warning",
                            detail="1")], before=[], after=[], tests=[], suites=[], client_warnings=[warning])
    assert Verdict.from_dict(v.to_dict()).client_warnings == [warning]
    assert summary_table(v).splitlines()[-1] == f"WARNING: {warning.message}"
