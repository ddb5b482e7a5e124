"""The doctor's predictions against every factor the package measured and keeps.

For each kept measurement (the reproducers' rows, the parity audit's points, the ALST recipe's rows, the
downstream clients' rows, the training-effect runs) the doctor's check (``patch_and_test.doctor.read.run_check``)
is run on the configuration that measurement used: the DeepSpeed config it ran, its sp, the parameter's
size, the DeepSpeed state (fixed or not) and the loss code. Its predicted reduce path and factor must be
what was observed, within the tolerance of the family that measured it. Rows the parity audit attributes
to another known upstream discrepancy (``repro/audit/known_discrepancies.toml``: predivide, bf16
optimizer, ...) are outside the doctor's rule and are counted, not compared.

DeepSpeed state of a kept report: ``before/`` of a pipeline cell ran the unpatched base, ``after/`` the
series' build (the pipeline's definition); the master-v4 reproducers ran the series' tree
(docs/master-v4-reproducers/README.md); the downstream and training reports record it (read from code).
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from patch_and_test.doctor import rule
from patch_and_test.doctor.read import run_check
from repro.audit.expect import reduce_path as audit_path
from repro.audit.space import AuditPoint
from repro.downstream.expect import ClientKind
from repro.harness import scales
from repro.training.report import TrainingReport
from tests.conftest import FIXTURES, ROOT

CELLS = [
    FIXTURES / "bundle-cell" / "results" / "patch-and-test-ds0.19.8-gloo",
    FIXTURES / "bundle" / "results" / "patch-and-test-ds0.14.5-gloo"
]
MASTER_V4 = ROOT / "docs" / "master-v4-reproducers"
AUDIT_FIXTURE = FIXTURES / "parity-audit" / "old-code-sp2dp1-buggy.json"
DOWNSTREAM = ROOT / "docs" / "downstream-results"
TRAINING = ROOT / "docs" / "figures"


@dataclasses.dataclass(frozen=True)
class Case:
    where: str
    config: dict
    sp: int
    deepspeed: rule.DeepSpeedState
    source: rule.LossSource
    numel: int | None
    observed_path: str | None  # None: the report does not say
    ratio: float
    residual: float
    tol: float  # norm-wise relative error allowed (scales.error_at)


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _state(folder: Path, version: str) -> rule.DeepSpeedState:
    fixed = {"before": False, "after": True}[folder.name]
    return rule.DeepSpeedState(version, fixed, fixed)


def _gradscale_cases() -> list[Case]:
    reports = [(p, _state(p.parent,
                          _load(p)["deepspeed_version"])) for cell in CELLS
               for p in sorted(cell.glob("*/zero3_sp_*.json"))]
    reports += [(p, rule.DeepSpeedState(_load(p)["deepspeed_version"], True, True))
                for p in sorted(MASTER_V4.glob("zero3_sp_*.json"))]
    out = []
    for path, state in reports:
        report = _load(path)
        for row in report["rows"]:
            zero = {
                k: row[k]
                for k in ("stage", "reduce_scatter", "contiguous_gradients", "reduce_bucket_size")
                if row.get(k) is not None
            }
            out.append(
                Case(f"{path.relative_to(ROOT)}: {row['config']} {row['param']}", {"zero_optimization": zero},
                     report["sp"], state, rule.own_loss("none"), row["numel"], row["path"], row["ratio"],
                     row["residual"], scales.TOLERANCES["audit"]["fp32"]))
    return out


def _audit_reports() -> list[tuple[Path, rule.DeepSpeedState]]:
    reports = [(p, _state(p.parent,
                          _load(p)["deepspeed_version"])) for cell in CELLS
               for p in sorted(cell.glob("*/parity_audit.json"))]
    return reports + [(AUDIT_FIXTURE, rule.DeepSpeedState(_load(AUDIT_FIXTURE)["deepspeed_version"], False, False))]


def _audit_cases() -> tuple[list[Case], int]:
    out, known = [], 0
    for path, state in _audit_reports():
        for point in _load(path)["points"]:
            if point["status"] != "ran":
                continue
            p = AuditPoint.model_validate(point["point"])
            config = {"zero_optimization": p.zero_section(), **p.config_overrides()}
            for row in point["rows"]:
                if row["known"]:
                    known += 1
                    continue
                out.append(
                    Case(f"{path.relative_to(ROOT)}: {point['id']} {row['param']}", config, p.sp, state,
                         rule.own_loss("none"), row["numel"], str(audit_path(row["path"])), row["ratio"],
                         row["residual"], scales.TOLERANCES["audit"][p.dtype]))
    return out, known


def _alst_cases() -> list[Case]:
    out = []
    for cell in CELLS:
        for path in sorted(cell.glob("*/alst_recipe.json")):
            report = _load(path)
            state = _state(path.parent, report["deepspeed_version"])
            for row in report["rows"]:
                out.append(
                    Case(f"{path.relative_to(ROOT)}: {row['recipe']} zero{row['stage']} {row['param']}",
                         {"zero_optimization": {
                             "stage": row["stage"]
                         }}, report["sp"], state, rule.own_loss(row["recipe"]), row["numel"], row["path"],
                         row["ratio"], row["residual"], scales.TOLERANCES["alst"]["ratio_rel_tol"]))
    return out


def _downstream_cases() -> list[Case]:
    out = []
    for path in sorted(DOWNSTREAM.glob("*/*/downstream_clients.json")):
        report = _load(path)
        state = rule.DeepSpeedState(report["deepspeed_version"], report["deepspeed_fixed"], report["marker"])
        for row in report["rows"]:
            if row["status"] != "measured":
                continue
            source = rule.LossSource(
                f"{row['client']} {row['client_version']}",
                ClientKind(row["kind"], row["gate"], row["gate_version"], row.get("divides_by_sp", False)),
                row["client"])
            # The row's ratio is one fit over its parameters; with DeepSpeed's defaults their size decides nothing.
            out.append(
                Case(f"{path.relative_to(ROOT)}: {row['client']} zero{row['stage']}",
                     {"zero_optimization": {
                         "stage": row["stage"]
                     }}, report["sp"], state, source, None, None, row["ratio"], row["residual"],
                     scales.TOLERANCES["alst"]["ratio_rel_tol"]))
    return out


def _training_cases() -> list[Case]:
    out = []
    for path in sorted(TRAINING.glob("training_effect-*.json")):
        report = TrainingReport.load(path)
        state = rule.DeepSpeedState(report.deepspeed_version, report.deepspeed_fixed, report.marker)
        for run in report.runs:
            # Step 0: the same weights; later steps add the optimizer's drift (training's grad_norm_rel_tol).
            for step, tol in ((0, scales.TOLERANCES["alst"]["ratio_rel_tol"]),
                              (len(run.steps) - 1, scales.TOLERANCES["training"]["grad_norm_rel_tol"])):
                ratio = run.steps[step].grad_norm / report.reference[step].grad_norm
                out.append(
                    Case(f"{path.relative_to(ROOT)}: {run.recipe} zero{run.stage} step {step}",
                         {"zero_optimization": {
                             "stage": run.stage
                         }}, report.sp, state, rule.own_loss(run.recipe), None, None, ratio, 0.0, tol))
    return out


def all_cases() -> tuple[list[Case], int]:
    audit, known = _audit_cases()
    return _gradscale_cases() + audit + _alst_cases() + _downstream_cases() + _training_cases(), known


def mismatches(cases: list[Case]) -> list[str]:
    out = []
    for case in cases:
        check = run_check(case.config, case.sp, case.deepspeed, [case.source])
        path, factor = check.prediction(case.numel if case.numel is not None else 1)
        if case.observed_path is not None and path != case.observed_path:
            out.append(f"{case.where}: path predicted {path}, observed {case.observed_path}")
        elif scales.error_at(case.ratio, case.residual, factor) > case.tol:
            out.append(f"{case.where}: factor predicted {scales.label(factor)}, measured {case.ratio:.6g}")
    return out


def test_every_kept_measurement_is_predicted():
    cases, known = all_cases()
    families = {
        name: len(f())
        for name, f in (("gradscale", _gradscale_cases), ("alst", _alst_cases), ("downstream", _downstream_cases),
                        ("training", _training_cases))
    }
    families["audit"] = len(_audit_cases()[0])
    # Every family's kept files were found and read (a moved folder must not turn this into a no-op).
    assert all(n > 0 for n in families.values()), families
    assert len(cases) >= 500 and known > 0, (len(cases), known)
    # Both DeepSpeed states and both the buggy and the right factors are among them.
    assert {c.deepspeed.fixed for c in cases} == {True, False}
    assert mismatches(cases) == []


def test_the_comparison_fails_when_the_rule_forgets_the_bug(monkeypatch):
    cases, _ = all_cases()
    monkeypatch.setattr(scales, "deepspeed_factor", lambda path, sp, expect: Fraction(1))
    found = mismatches(cases)
    assert len(found) > 20, found
    assert any("measured 0.5" in m for m in found)


def test_the_comparison_fails_when_the_path_rule_ignores_the_bucket(monkeypatch):
    cases, _ = all_cases()
    real = rule.reduce_path

    def no_bucket(z, numel):  # every ZeRO-3 contiguous parameter as if it fitted
        return real(z, 0 if z.bucket_decides else numel)

    monkeypatch.setattr(rule, "reduce_path", no_bucket)
    found = mismatches(cases)
    assert any("path predicted __avg_scatter_contiguous_grads, observed __avg_scatter_grads" in m
               for m in found), found


@pytest.mark.parametrize("fixed, expected", [(False, 0.5), (True, 1.0)])
def test_a_kept_mixed_bucket_row_by_hand(fixed, expected):
    # zero3 rs=False cg=True bucket=16: the 64-element weight overflows the bucket (the mixed case).
    check = run_check(
        {
            "zero_optimization": {
                "stage": 3,
                "reduce_scatter": False,
                "contiguous_gradients": True,
                "reduce_bucket_size": 16
            }
        }, 2, rule.DeepSpeedState("0.19.8", fixed, fixed), [rule.own_loss("none")], [("w", 64), ("b", 4)])
    assert check.prediction(64) == ("__avg_scatter_grads", expected)
    assert check.prediction(4) == ("__avg_scatter_contiguous_grads", 1.0)
    assert math.isclose(expected, 1.0) != check.verdict.affected
