"""What each audit row should be, and whether it is: tolerances, known discrepancies, judging rows and points.
Pure logic, no torch, no DeepSpeed; docs/parity-audit.md ("Judging") explains the rule and the tolerances."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pydantic import field_validator, model_validator

from repro.harness.files import load_toml
from repro.harness import scales
from repro.harness.report import Record
from repro.harness.scales import EXPECTATIONS, ReducePath, bug_scales, error_at, expected_scale

KNOWN_SCHEMA = "zero3-sp-gradfix/known-discrepancies/v1"
DEFAULT_KNOWN_FILE = Path(__file__).resolve().with_name("known_discrepancies.toml")

TOLERANCES = scales.TOLERANCES["audit"]  # dtype -> norm-wise relative error allowed


def at_scale(ratio: float, residual: float, scale: float, dtype: str) -> bool:
    return error_at(ratio, residual, scale) <= TOLERANCES[dtype]


_FACTOR_VARS = ("sp", "dp", "world", "predivide", "gas")


def eval_factor(expr: str, fields: dict[str, Any]) -> float:
    """Evaluate ``a / b * c`` over numbers and sp, dp, world, predivide (the factor), gas."""

    def value(node) -> float:
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            left, right = value(node.left), value(node.right)
            return left * right if isinstance(node.op, ast.Mult) else left / right
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in _FACTOR_VARS:
            return float(fields["predivide_factor" if node.id == "predivide" else node.id])
        raise ValueError(f"bad factor expression {expr!r}: numbers, * and / over {_FACTOR_VARS}")

    try:
        return value(ast.parse(expr.strip(), mode="eval").body)
    except SyntaxError:
        raise ValueError(f"bad factor expression {expr!r}") from None


# Fields a predicate may test: the point's, plus the row's observed path and parameter name.
PREDICATE_KEYS = ("stage", "reduce_scatter", "contiguous_gradients", "bucket", "sp", "dp", "world", "dtype", "gas",
                  "predivide", "prescale", "path", "param")
# The covered gradients are wrong in direction too (e.g. never reduced): expected only off the predicted scale.
NOT_A_SCALE = "not-a-scale"


def version_matches(version: str, spec: str) -> bool:
    """``spec``: comma-separated ``<``, ``<=``, ``>``, ``>=`` or ``==`` clauses; only release numbers compare."""
    specs = SpecifierSet(spec)
    if bad := [s for s in specs if s.operator not in ("<", "<=", ">", ">=", "==")]:
        raise ValueError(f"bad version clause {str(bad[0])!r} in {spec!r}")
    return specs.contains(".".join(map(str, Version(version.strip()).release)))


class KnownEntry(Record):
    """A known discrepancy the rows were judged with, as the report records it."""

    id: str
    title: str
    factor: str
    versions: str = ""
    writeup: str
    upstream: str
    measured_on: tuple[str, ...]


class KnownDiscrepancy(KnownEntry):
    """An entry of the known-discrepancy file: ``factor`` x the expected scale (or NOT_A_SCALE) where ``when``
    (field -> allowed values, all must match) covers a row, on the DeepSpeed ``versions`` ("": all)."""

    when: dict[str, tuple]
    code: tuple[str, ...]

    @field_validator("when", mode="before")
    @classmethod
    def _predicate(cls, when: dict) -> dict:
        if bad := [k for k in when if k not in PREDICATE_KEYS]:
            raise ValueError(f"unknown predicate keys {bad}; allowed: {PREDICATE_KEYS}")
        return {k: tuple(v) if isinstance(v, (list, tuple)) else (v, ) for k, v in when.items()}

    @model_validator(mode="after")
    def _syntax(self) -> KnownDiscrepancy:
        self.factor_for({"sp": 2, "dp": 1, "world": 2, "predivide_factor": 2.0, "gas": 1})
        if self.versions:
            version_matches("0.0.0", self.versions)
        return self

    def covers(self, fields: dict[str, Any], version: str | None = None) -> bool:
        if self.versions and version is not None and not version_matches(version, self.versions):
            return False
        return all(fields.get(key) in allowed for key, allowed in self.when.items())

    @property
    def is_scale(self) -> bool:
        return self.factor != NOT_A_SCALE

    def factor_for(self, fields: dict[str, Any]) -> float:
        return eval_factor(self.factor, fields) if self.is_scale else 1.0


def load_known(path: Path | str = DEFAULT_KNOWN_FILE, root: Path | None = None) -> list[KnownDiscrepancy]:
    """Read and validate the known-discrepancy file; ``root``: where write-up paths must exist."""
    path = Path(path)
    data = load_toml(path)
    if data.get("schema") != KNOWN_SCHEMA:
        raise ValueError(f"{path}: not a {KNOWN_SCHEMA} file (schema={data.get('schema')!r})")
    out: list[KnownDiscrepancy] = []
    for entry in data.get("discrepancy", []):
        try:
            item = KnownDiscrepancy.model_validate(entry)
        except ValueError as err:
            raise ValueError(f"{path}: discrepancy {entry.get('id', '?')!r}: {err}") from None
        if item.id in {k.id for k in out}:
            raise ValueError(f"{path}: duplicate id {item.id!r}")
        if root is not None and not (Path(root) / item.writeup).is_file():
            raise ValueError(f"{path}: {item.id}: write-up {item.writeup} does not exist")
        out.append(item)
    return out


def reduce_path(observed: str) -> ReducePath:
    """The ``ReducePath`` of a row's observed path (ZeRO-3's method names; ``stage_1_and_2.*``; ``engine.*``)."""
    for prefix, path in (("stage_1_and_2", ReducePath.STAGE_1_2), ("engine", ReducePath.STAGE_0)):
        if observed.startswith(prefix):
            return path
    return ReducePath(observed)


class _ByExpectation(Record):
    """One value per expectation, keyed like the JSON: ``x["fixed"]`` / ``x["buggy"]``."""

    def __getitem__(self, expect: str):
        if expect not in EXPECTATIONS:
            raise KeyError(expect)
        return getattr(self, expect)


class Targets(_ByExpectation):
    """The scale each expectation predicts (None: "not a scale", see expect.NOT_A_SCALE)."""

    fixed: float | None
    buggy: float | None


class Verdicts(_ByExpectation):
    """Whether the row is where each expectation puts it."""

    fixed: bool
    buggy: bool


class MeasuredRow(Record):
    """What a rank measures for one parameter at one point (judged later, see ``judge``)."""

    param: str
    numel: int
    path: str  # the observed reduce code path
    grad_dtype: str
    ratio: float  # <observed, oracle> / <oracle, oracle>
    residual: float  # ||observed - ratio * oracle|| / ||oracle||
    max_rel_dev: float  # max_i |observed_i - ratio * oracle_i| / |ratio * oracle_i|


class Row(MeasuredRow):
    """A judged row: the measurement and where the expectations put it."""

    label: str  # the ratio as a fraction within tolerance ("1", "1/2", ...) or "other"
    known: tuple[str, ...]  # ids of the known discrepancies covering the row
    target: Targets
    ok: Verdicts
    at_oracle: bool  # at 1.0
    at_sp_bug: bool  # __avg_scatter_grads, sp > 1, at 1/sp


def judge_row(point_fields: dict[str, Any], row: MeasuredRow, known: Sequence[KnownDiscrepancy],
              version: str | None = None) -> Row:
    fields = dict(point_fields, path=row.path, param=row.param)
    covering = [k for k in known if k.covers(fields, version)]
    factor = math.prod(k.factor_for(fields) for k in covering)
    not_a_scale = any(not k.is_scale for k in covering)
    sp, dtype = fields["sp"], fields["dtype"]
    at_oracle = at_scale(row.ratio, row.residual, 1.0, dtype)
    target, ok = {}, {}
    observed_path = reduce_path(row.path)
    for e in EXPECTATIONS:
        scale = expected_scale(observed_path, sp, e) * factor
        at = at_scale(row.ratio, row.residual, scale, dtype)
        target[e] = None if not_a_scale else scale
        ok[e] = not (at or at_oracle) if not_a_scale else at
    return Row(**row.model_dump(), label=scales.label(row.ratio, row.residual, tol=TOLERANCES[dtype]),
               known=tuple(k.id for k in covering), target=target, ok=ok, at_oracle=at_oracle,
               at_sp_bug=bug_scales(observed_path, sp) and at_scale(row.ratio, row.residual, 1.0 / sp, dtype))


# Point categories, in the order the summary lists them.
CATEGORIES = ("match", "sp_bug", "known", "unexplained", "rejected", "error")


def point_category(status: str, rows: Sequence[Row]) -> str:
    """What a point showed, whatever the expectation (docs/parity-audit.md)."""
    if status != "ran":
        return status
    if not rows:
        return "error"
    if all(r.at_oracle for r in rows):
        return "match"
    if all(r.at_oracle or (r.at_sp_bug and not r.known) for r in rows):
        return "sp_bug"
    if all(r.ok["buggy"] or r.ok["fixed"] for r in rows):
        return "known"
    return "unexplained"


def point_holds(status: str, rows: Sequence[Row], expect: str) -> bool:
    """Rejected points keep the expectation, errors do not, run points when every row is where it predicts."""
    return status == "rejected" or (status == "ran" and bool(rows) and all(r.ok[expect] for r in rows))
