from pathlib import Path

import pytest
import torch

from repro.audit.expect import (DEFAULT_KNOWN_FILE, NOT_A_SCALE, TOLERANCES, KnownDiscrepancy, MeasuredRow, Row,
                                eval_factor, load_known, point_category, point_holds, reduce_path, version_matches)
from repro.audit.expect import judge_row as _judge_row
from repro.audit.space import AuditPoint
from repro.harness.scales import ReducePath, error_at, label

ROOT = Path(__file__).resolve().parents[2]
# Each audited dtype's unit roundoff (eps / 2): what the audit's tolerances are justified by.
UNIT_ROUNDOFF = {
    name: torch.finfo(dtype).eps / 2
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
}


def _fields(**kw):
    base = dict(stage=3, reduce_scatter=False, contiguous_gradients=False, bucket="fits", sp=2, dp=1, dtype="fp32",
                gas=1, predivide="1", prescale=False)
    base.update(kw)
    return AuditPoint(**base).model_dump()


def judge_row(fields, path, param, ratio, residual, known, version=None):
    """The row's judgement, its targets and verdicts as plain dicts."""
    row = MeasuredRow(param=param, numel=4, path=path, grad_dtype="float32", ratio=ratio, residual=residual,
                      max_rel_dev=0.0)
    j = _judge_row(fields, row, known, version)
    return j.model_copy(update=dict(target=j.target.model_dump(), ok=j.ok.model_dump()))


def _known(**kw):
    base = dict(id="k", title="t", when={"stage": (3, )}, factor="1/predivide", writeup="w.md", code=("c", ),
                upstream="u", measured_on=("0.19.8", ))
    base.update(kw)
    return KnownDiscrepancy(**base)


def test_error_at_is_the_normwise_error_against_any_scale():
    # o = 0.5 e exactly: at 0.5 no error, at 1.0 half of it
    assert error_at(0.5, 0.0, 0.5) == 0.0
    assert error_at(0.5, 0.0, 1.0) == pytest.approx(0.5)
    assert error_at(1.0, 0.03, 1.0) == pytest.approx(0.03)
    with pytest.raises(ValueError):
        error_at(1.0, 0.0, 0.0)


def test_tolerances_keep_the_scales_apart():
    # every pair of scales the audit names is further apart than twice the loosest tolerance
    scales = sorted({1 / a / b for a in (1, 2, 4) for b in (1, 2, 3, 4)})
    loosest = max(TOLERANCES.values())
    for lo, hi in zip(scales, scales[1:]):
        assert (hi - lo) / hi > 2 * loosest
    # and the tolerance covers the rounding bound it is justified by
    for dtype, tol in TOLERANCES.items():
        assert tol >= 10 * UNIT_ROUNDOFF[dtype]
    assert UNIT_ROUNDOFF == {"fp32": 2.0**-24, "bf16": 2.0**-8}


@pytest.mark.parametrize("ratio,residual,dtype,expected", [(1.0, 0.0, "fp32", "1"), (0.5, 1e-8, "fp32", "1/2"),
                                                           (0.125, 0.0, "fp32", "1/8"), (0.503, 0.0, "fp32", "other"),
                                                           (0.503, 0.0, "bf16", "1/2"), (0.26, 0.2, "bf16", "other"),
                                                           (-1.0, 0.0, "fp32", "other")])
def test_ratio_label(ratio, residual, dtype, expected):
    # the audit labels an observed ratio with the one label of repro.harness.scales, at its dtype's tolerance
    assert label(ratio, residual, tol=TOLERANCES[dtype]) == expected


def test_eval_factor():
    f = dict(sp=2, dp=2, world=4, predivide_factor=4.0, gas=2)
    assert eval_factor("1/predivide", f) == 0.25
    assert eval_factor("1/sp", f) == 0.5
    assert eval_factor("sp * dp / world", f) == 1.0
    assert eval_factor("2", f) == 2.0
    for bad in ("", "1/", "/sp", "1/foo", "__import__('os')", "1//2"):
        with pytest.raises(ValueError):
            eval_factor(bad, f)


@pytest.mark.parametrize("version,spec,ok", [("0.19.8", "<0.19.8", False), ("0.19.4", "<0.19.8", True),
                                             ("0.14.5", ">=0.14.5,<0.19.8", True), ("0.19.8", "==0.19.8", True),
                                             ("0.19.6.dev0", "<0.19.8", True), ("0.19.8+abc", ">0.19.7", True)])
def test_version_matches(version, spec, ok):
    assert version_matches(version, spec) is ok


def test_version_spec_errors():
    with pytest.raises(ValueError):
        version_matches("0.19.8", "~=0.19")


def test_repo_known_file_is_valid_and_every_writeup_exists():
    known = load_known(DEFAULT_KNOWN_FILE, root=ROOT)
    assert known and len({k.id for k in known}) == len(known)
    for k in known:
        assert (ROOT / k.writeup).is_file() and k.code and k.measured_on


def test_load_known_rejects_bad_files(tmp_path):
    bad = tmp_path / "k.toml"
    bad.write_text('schema = "other"\n')
    with pytest.raises(ValueError, match="schema"):
        load_known(bad)
    entry = ('[[discrepancy]]\nid = "a"\ntitle = "t"\nwhen = { stage = [3] }\nfactor = "1/sp"\nwriteup = "w.md"\n'
             'code = ["c"]\nupstream = "u"\nmeasured_on = ["0.19.8"]\n')
    head = 'schema = "zero3-sp-gradfix/known-discrepancies/v1"\n'
    bad.write_text(head + entry + entry)
    with pytest.raises(ValueError, match="duplicate"):
        load_known(bad)
    bad.write_text(head + entry.replace("stage = [3]", "colour = [3]"))
    with pytest.raises(ValueError, match="unknown predicate"):
        load_known(bad)
    bad.write_text(head + entry.replace('"1/sp"', '"1/nothing"'))
    with pytest.raises(ValueError):
        load_known(bad)
    bad.write_text(head + entry)
    with pytest.raises(ValueError, match="does not exist"):
        load_known(bad, root=tmp_path)
    (tmp_path / "w.md").write_text("x")
    assert [k.id for k in load_known(bad, root=tmp_path)] == ["a"]


def test_sp_bug_under_each_expectation():
    j = judge_row(_fields(sp=2), "__avg_scatter_grads", "large", 0.5, 0.0, [])
    assert j.target == {"fixed": 1.0, "buggy": 0.5} and j.ok == {"fixed": False, "buggy": True}
    assert j.at_sp_bug and not j.at_oracle and j.known == ()
    fixed = judge_row(_fields(sp=4, dp=1), "__avg_scatter_grads", "large", 1.0, 0.0, [])
    assert fixed.ok == {"fixed": True, "buggy": False}
    # no sp, or another path: 1.0 under both
    for fields, path in ((_fields(sp=1, dp=2), "__avg_scatter_grads"), (_fields(), "__avg_scatter_contiguous_grads"),
                         (_fields(stage=1), "stage_1_and_2.gradient_reduction_w_predivide")):
        j = judge_row(fields, path, "small", 1.0, 0.0, [])
        assert j.target == {"fixed": 1.0, "buggy": 1.0} and all(j.ok.values())


def test_observed_paths_map_onto_the_one_rule():
    assert reduce_path("__avg_scatter_grads") is ReducePath.AVG_SCATTER
    assert reduce_path("__avg_scatter_contiguous_grads") is ReducePath.CONTIGUOUS
    for observed in ("stage_1_and_2.gradient_reduction_w_predivide", "stage_1_and_2.average_tensor[reduce_scatter]",
                     "stage_1_and_2.buffered_reduce_fallback", "stage_1_and_2 (no reduce method observed)"):
        assert reduce_path(observed) is ReducePath.STAGE_1_2
    for observed in ("engine.allreduce_bucket", "engine (no allreduce_bucket call)"):
        assert reduce_path(observed) is ReducePath.STAGE_0
    with pytest.raises(ValueError):
        reduce_path("somewhere else")
    with pytest.raises(ValueError):  # the rule's own checks
        judge_row({**_fields(), "sp": 0}, "__avg_scatter_grads", "large", 1.0, 0.0, [])


def test_known_factor_composes_with_the_sp_bug():
    k = _known(when={"stage": (3, ), "predivide": ("world", ), "path": ("__avg_scatter_grads", )})
    f = _fields(sp=2, dp=2, predivide="world")  # factor 4.0
    j = judge_row(f, "__avg_scatter_grads", "large", 1 / 8, 0.0, [k])
    assert j.known == ("k", ) and j.target == {"fixed": 0.25, "buggy": 0.125} and j.ok["buggy"] and not j.ok["fixed"]
    assert not j.at_sp_bug
    # a row the predicate does not cover is untouched
    j = judge_row(f, "__avg_scatter_contiguous_grads", "small", 1.0, 0.0, [k])
    assert j.known == () and j.ok == {"fixed": True, "buggy": True}


def test_known_versions_limit_an_entry():
    k = _known(when={"stage": (1, )}, factor=NOT_A_SCALE, versions="<0.19.8")
    f = _fields(stage=1, contiguous_gradients=False)
    wrong = judge_row(f, "stage_1_and_2.buffered_reduce_fallback", "large", 0.28, 0.28, [k], "0.18.9")
    assert wrong.known == ("k", ) and wrong.target == {"fixed": None, "buggy": None} and all(wrong.ok.values())
    # once fixed, the same rows are expected at the oracle
    right = judge_row(f, "stage_1_and_2.buffered_reduce_fallback", "large", 1.0, 0.0, [k], "0.19.8")
    assert right.known == () and all(right.ok.values())
    # a not-a-scale entry that stops reproducing is reported
    stale = judge_row(f, "stage_1_and_2.buffered_reduce_fallback", "large", 1.0, 0.0, [k], "0.18.9")
    assert not any(stale.ok.values())


def _row(**kw):
    base = dict(known=(), target={
        "fixed": 1.0,
        "buggy": 1.0
    }, at_oracle=True, at_sp_bug=False, ok={
        "fixed": True,
        "buggy": True
    })
    base.update(kw)
    return Row(param="p", numel=1, path="x", grad_dtype="float32", ratio=1.0, residual=0.0, max_rel_dev=0.0, label="1",
               **base)


def test_point_category_and_holds():
    match = [_row(), _row()]
    sp_bug = [_row(), _row(at_oracle=False, at_sp_bug=True, ok={"fixed": False, "buggy": True})]
    known = [_row(at_oracle=False, known=("k", ), ok={"fixed": True, "buggy": True})]
    both = [_row(at_oracle=False, known=("k", ), ok={"fixed": False, "buggy": True})]
    odd = [_row(at_oracle=False, ok={"fixed": False, "buggy": False})]
    assert point_category("ran", match) == "match"
    assert point_category("ran", sp_bug) == "sp_bug"
    assert point_category("ran", known) == "known" and point_category("ran", both) == "known"
    assert point_category("ran", odd) == "unexplained"
    assert point_category("rejected", []) == "rejected" and point_category("error", []) == "error"
    assert point_category("ran", []) == "error"
    assert point_holds("ran", sp_bug, "buggy") and not point_holds("ran", sp_bug, "fixed")
    assert point_holds("rejected", [], "fixed") and not point_holds("error", [], "buggy")
    assert not point_holds("ran", odd, "buggy") and not point_holds("ran", [], "buggy")
