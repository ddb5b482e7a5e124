"""The downstream census: who drives DeepSpeed with ``sequence_parallel_size > 1``, and what each gets.

``docs/downstream-results/census.json`` (``Census``) holds what was read in each library's release; the factors
come from the kept ``tox -m downstream`` reports where measured, else from the rule on the recipe read from the
code. ``zero3-sp docs`` renders the table into docs/downstream-notice.md between its census marker lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Optional

from pydantic import model_validator

from patch_and_test.core import templating
from patch_and_test.downstream.table import KEPT_RESULTS, PHASES, REPORT
from patch_and_test.core.templating import Model
from repro.downstream.expect import STAGES, ClientKind, expected_ratio
from repro.downstream.report import DownstreamReport
from repro.harness import scales
from repro.harness.report import JsonReport, Record

CENSUS = KEPT_RESULTS / "census.json"
BEGIN = "<!-- downstream-census:begin (rendered by zero3-sp docs; do not edit) -->"
END = "<!-- downstream-census:end -->"
Verdict = Literal["gains from the fix", "must change with it", "untouched"]


class Evidence(Record):
    """Lines of a released wheel (or of a package it runs on) and what they do."""
    file: str  # the path inside the wheel, e.g. "accelerate/accelerator.py"
    lines: str  # "2388-2397"
    shows: str


class MeasuredIn(Record):
    """The kept reports that carry a library's rows: ``docs/downstream-results/<env>/<phase>/``."""
    env: str
    client: str  # the rows' ``client``
    client_version: str


class Library(Record):
    """One library of the census, as read in ``version`` (the newest on PyPI unless ``newest`` says otherwise)."""
    label: str  # "transformers 5.25"
    distribution: str  # its name on PyPI
    version: str  # the release read (and measured)
    newest: str  # the newest release on PyPI when the census was taken
    requires_python: str
    drives_sp: bool  # it makes DeepSpeed's sequence_parallel_size > 1
    how: str  # how, or what it does instead
    evidence: list[Evidence]
    loss: str  # its loss recipe on DeepSpeed sp, in words
    gate: str  # version / ZeRO-stage gates and refusals, in words ("-": none)
    recipe: Optional[ClientKind] = None  # read from its code, for the rule where it is not measured
    measured: Optional[MeasuredIn] = None
    not_measured: Optional[str] = None  # why its own code could not be run here
    note: str = ""

    @model_validator(mode="after")
    def _factors_have_a_source(self) -> "Library":
        if not self.drives_sp:
            if self.measured or self.recipe:
                raise ValueError(f"{self.label}: leaves DeepSpeed's sp at 1, so it has no factor to measure or read")
        elif self.measured is None and (self.recipe is None or not self.not_measured):
            raise ValueError(f"{self.label}: drives sp > 1 but is neither measured nor read (recipe + not_measured)")
        return self


class Citation(Record):
    """Public code off PyPI that compensates for the bug by hand: cited, not measured."""
    ref: str  # "hamishivi/tmax#9"
    url: str
    state: str  # "merged 2026-09-10"
    does: str
    with_the_fix: str
    verdict: Verdict


class Census(JsonReport):
    """JSON schema ``zero3-sp-gradfix/downstream-census/v1``: the census (module docstring)."""
    SCHEMA: ClassVar[str] = "zero3-sp-gradfix/downstream-census/v1"

    checked: str  # the date the releases on PyPI were read
    deepspeed_version: str  # the DeepSpeed release of the measured and the read factors, unpatched and patched
    sp: int
    libraries: list[Library]
    off_pypi: list[Citation]


class Factor(Model):
    value: float
    label: str  # the simple fraction (scales.label): "1", "2", "1/2"
    measured: bool
    matches_rule: Optional[bool] = None  # measured: the report's check against the rule


class StageFactors(Model):
    stage: int
    unpatched: Factor
    patched: Factor


class CensusRow(Model):
    library: Library
    stages: list[StageFactors]  # empty: DeepSpeed's sp stays 1
    source: str  # where the factors come from
    verdict: Verdict


def verdict(stages: list[StageFactors]) -> Verdict:
    """A true gradient the fix makes wrong: must change; a wrong one it makes true: gains. Pure."""
    if any(s.unpatched.label == "1" and s.patched.label != "1" for s in stages):
        return "must change with it"
    if any(s.unpatched.label != "1" and s.patched.label == "1" for s in stages):
        return "gains from the fix"
    return "untouched"


def read_factors(recipe: ClientKind, sp: int, deepspeed_version: str) -> list[StageFactors]:
    """The rule on the recipe read from the code: unpatched; patched as the kept runs are (fix + marker). Pure."""

    def factor(stage: int, fixed: bool) -> Factor:
        value = expected_ratio(recipe, stage, sp, fixed, deepspeed_version, fixed)
        return Factor(value=value, label=scales.label(value), measured=False)

    return [StageFactors(stage=s, unpatched=factor(s, False), patched=factor(s, True)) for s in STAGES]


def measured_factors(where: MeasuredIn, recipe: ClientKind | None, results: Path, sp: int) -> list[StageFactors]:
    """The library's rows in the kept reports of its env; ValueError when one is missing or disagrees."""
    by_phase = {}
    for phase in PHASES:
        path = results / where.env / phase / REPORT
        if not path.is_file():
            raise ValueError(f"{where.client} {where.client_version}: no kept report {path}")
        report = DownstreamReport.load(path)
        if report.deepspeed_fixed != (phase == "patched") or report.sp != sp:
            raise ValueError(f"{path}: not the {phase} DeepSpeed at sp={sp}")
        key = (where.client, where.client_version)
        rows = {r.stage: r for r in report.rows if (r.client, r.client_version) == key and r.status == "measured"}
        if set(rows) != set(STAGES):
            raise ValueError(f"{path}: no measured ZeRO-2 and ZeRO-3 rows of {where.client} {where.client_version}")
        by_phase[phase] = {}
        for stage, r in rows.items():
            if recipe is not None and recipe != r.recipe:
                raise ValueError(f"{path}: the run classified {where.client}'s code as {r.recipe}, "
                                 f"the census reads {recipe}")
            by_phase[phase][stage] = Factor(value=r.ratio, label=scales.label(r.ratio, r.residual), measured=True,
                                            matches_rule=r.matches_rule)
    return [StageFactors(stage=s, **{phase: by_phase[phase][s] for phase in PHASES}) for s in STAGES]


def rows(census: Census, results: Path = KEPT_RESULTS) -> list[CensusRow]:
    out = []
    for lib in census.libraries:
        if not lib.drives_sp:
            stages, source = [], "-"
        elif lib.measured is not None:
            stages = measured_factors(lib.measured, lib.recipe, results, census.sp)
            source = f"measured: `docs/downstream-results/{lib.measured.env}/`"
        else:
            stages = read_factors(lib.recipe, census.sp, census.deepspeed_version)
            source = f"read from the code, not measured: {lib.not_measured}"
        out.append(CensusRow(library=lib, stages=stages, source=source,
                             verdict=verdict(stages)))  # no stages (sp stays 1): untouched
    return out


def render(census: Census | None = None, results: Path = KEPT_RESULTS) -> str:
    """The census table and the cited hand compensations (no markers); by default the notice's: census.json with the
    kept runs."""
    census = Census.load(CENSUS) if census is None else census
    return templating.render("downstream_census.md.j2", census=census, rows=rows(census, results)).rstrip("\n")
