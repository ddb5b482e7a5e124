"""What each audit row should be, and whether it is: pure logic, no torch, no DeepSpeed.

A row is one parameter's full gradient at one point. DeepSpeed's gradient ``o`` is compared with
the oracle ``e`` (sum over sp, mean over dp, mean over micro-steps; plain torch, float64) through
two numbers the rank computes: the best-fit scale ``ratio = <o,e>/<e,e>`` and the residual
``||o - ratio*e|| / ||e||``. Because ``o - ratio*e`` is orthogonal to ``e``, the norm-wise
relative error against any scale ``s`` follows from those two alone:

    err(s) = ||o - s*e|| / ||s*e|| = sqrt(residual^2 + (ratio - s)^2) / s

and a row "is at scale s" when err(s) <= the tolerance of its dtype (``TOLERANCES``).

Expected scale of a row = the rule of ``repro.harness.scales.expected_scale`` for its observed
path, sp and expectation (the probe's loss recipe is ``none``) x the factors of every known
discrepancy whose predicate covers it:

* the rule, ``--expect buggy``: 1/sp for a gradient reduced by ZeRO-3's ``__avg_scatter_grads``
  with sp > 1 (the bug this package fixes), 1.0 otherwise;
* the rule, ``--expect fixed``: 1.0 everywhere;
* known discrepancies (``repro/audit/known_discrepancies.toml``): other upstream bugs, each
  written up in ``docs/upstream-candidates/``; their factors compose with the rule (a predivide
  bug on the same path as the sp bug multiplies both).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from repro.harness.files import load_toml
from repro.harness.scales import EXPECTATIONS, ReducePath, bug_scales, error_at, expected_scale

KNOWN_SCHEMA = "zero3-sp-gradfix/known-discrepancies/v1"
DEFAULT_KNOWN_FILE = Path(__file__).resolve().with_name("known_discrepancies.toml")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Norm-wise relative error allowed between DeepSpeed's gradient and scale x the oracle.

    The oracle sees the operands the engine sees (weights and inputs rounded to the engine's
    dtype) and computes in float64, so what is left is the engine's own rounding. Per element,
    the probe's gradient is p * x^2 on every rank and micro-step: all contributions to a sum
    share the sign of p, so there is no cancellation and each rounding adds at most the unit
    roundoff u to the relative error. Counting the operations a gradient passes through, at
    most: the forward product p*x and the backward product (2), the 1/gas loss scale (exact,
    a power of two), a predivide by 3 or the world size, the division by world/sp, up to 3
    additions in the reduction over 4 ranks, a postscale, the accumulation over 2 micro-steps
    and a cast: 10 roundings, so |err| <= 10 u.

    * fp32: u = 2^-24 = 6.0e-8; 10 u = 6e-7; tolerance 1e-5 (the reproducers' rtol).
    * bf16 (8-bit significand): u = 2^-8 = 3.9e-3; 10 u = 0.039; tolerance 0.05.

    Scales the audit tells apart (1, 1/2, 1/3, 1/4, 1/6, 1/8, 1/16, ...) differ by at least
    25% from each other, more than twice the largest tolerance (10%), so a row can be within
    tolerance of at most one of them: 1.0 / 1/sp / other stay unambiguous in bf16.
    The measured worst case is reported in each run (``max_rel_err`` per dtype in the summary).
    """

    dtype: str
    rel: float
    unit_roundoff: float


TOLERANCES = {
    "fp32": Tolerance("fp32", 1e-5, 2.0**-24),
    "bf16": Tolerance("bf16", 5e-2, 2.0**-8),
}


def at_scale(ratio: float, residual: float, scale: float, dtype: str) -> bool:
    """The row is at ``scale`` x the oracle within its dtype's tolerance (``scales.error_at``)."""
    return error_at(ratio, residual, scale) <= TOLERANCES[dtype].rel


# --------------------------------------------------------------------------- known discrepancies

_FACTOR_VARS = ("sp", "dp", "world", "predivide", "gas")
_FACTOR_TOKEN = re.compile(r"\s*([*/])?\s*([A-Za-z_]+|\d+(?:\.\d+)?)\s*")


def eval_factor(expr: str, fields: dict[str, Any]) -> float:
    """Evaluate ``a / b * c`` over numbers and sp, dp, world, predivide (the factor), gas."""
    pos, value, first = 0, 1.0, True
    while pos < len(expr):
        match = _FACTOR_TOKEN.match(expr, pos)
        if not match or match.end() == pos:
            raise ValueError(f"bad factor expression {expr!r} at {expr[pos:]!r}")
        op, term = match.groups()
        if first == (op is not None):
            raise ValueError(f"bad factor expression {expr!r}")
        if term[0].isdigit():
            number = float(term)
        elif term in _FACTOR_VARS:
            number = float(fields["predivide_factor" if term == "predivide" else term])
        else:
            raise ValueError(f"unknown variable {term!r} in factor {expr!r}; use one of {_FACTOR_VARS}")
        value = number if first else (value * number if op == "*" else value / number)
        first, pos = False, match.end()
    if first:
        raise ValueError("empty factor expression")
    return value


# Fields a predicate may test: the point's, plus the row's observed path and parameter name.
PREDICATE_KEYS = ("stage", "reduce_scatter", "contiguous_gradients", "bucket", "sp", "dp", "world", "dtype", "gas",
                  "predivide", "prescale", "path", "param")
# A factor that is not a scale: the covered gradients are wrong in direction as well (e.g. never
# reduced); the expectation is then only "not at the scale the rest predicts".
NOT_A_SCALE = "not-a-scale"


def parse_version(text: str) -> tuple[int, ...]:
    """'0.19.8' -> (0, 19, 8); a local or pre-release suffix ('0.19.8+abc', '0.19.6.dev0') is dropped (PEP 440)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text.strip()).release
    except InvalidVersion:
        raise ValueError(f"not a version: {text!r}") from None


_VERSION_CLAUSE = re.compile(r"^\s*(<=|>=|==|<|>)\s*([0-9][0-9A-Za-z.+]*)\s*$")


def version_matches(version: str, spec: str) -> bool:
    """``spec``: comma-separated clauses, each ``<``, ``<=``, ``>``, ``>=`` or ``==`` a version."""
    v = parse_version(version)
    for clause in spec.split(","):
        match = _VERSION_CLAUSE.match(clause)
        if not match:
            raise ValueError(f"bad version clause {clause!r} in {spec!r}")
        op, other = match.group(1), parse_version(match.group(2))
        width = max(len(v), len(other))
        a, b = v + (0, ) * (width - len(v)), other + (0, ) * (width - len(other))
        if not {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b}[op]:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class KnownDiscrepancy:
    id: str
    title: str
    when: dict[str, tuple]  # field -> allowed values; every listed field must match
    factor: str  # the observed ratio is factor x what the expectation predicts, or NOT_A_SCALE
    writeup: str
    code: tuple[str, ...]
    upstream: str
    measured_on: tuple[str, ...]
    versions: str = ""  # DeepSpeed versions it applies to, e.g. ">=0.14.5,<0.19.8"; "" = all

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
    out, seen = [], set()
    for entry in data.get("discrepancy", []):
        missing = [
            k for k in ("id", "title", "when", "factor", "writeup", "code", "upstream", "measured_on")
            if k not in entry
        ]
        if missing:
            raise ValueError(f"{path}: discrepancy {entry.get('id', '?')!r} lacks {missing}")
        if entry["id"] in seen:
            raise ValueError(f"{path}: duplicate id {entry['id']!r}")
        seen.add(entry["id"])
        bad = [k for k in entry["when"] if k not in PREDICATE_KEYS]
        if bad:
            raise ValueError(f"{path}: {entry['id']}: unknown predicate keys {bad}; allowed: {PREDICATE_KEYS}")
        when = {k: tuple(v) if isinstance(v, list) else (v, ) for k, v in entry["when"].items()}
        item = KnownDiscrepancy(id=entry["id"], title=entry["title"], when=when, factor=entry["factor"],
                                writeup=entry["writeup"], code=tuple(entry["code"]), upstream=entry["upstream"],
                                measured_on=tuple(entry["measured_on"]), versions=entry.get("versions", ""))
        if item.is_scale:  # syntax check
            eval_factor(item.factor, {"sp": 2, "dp": 1, "world": 2, "predivide_factor": 2.0, "gas": 1})
        if item.versions:
            version_matches("0.0.0", item.versions)  # syntax check
        if root is not None and not (Path(root) / item.writeup).is_file():
            raise ValueError(f"{path}: {item.id}: write-up {item.writeup} does not exist")
        out.append(item)
    return out


# --------------------------------------------------------------------------- judging rows

_REDUCE_PATHS = frozenset(p.value for p in ReducePath)


def reduce_path(observed: str) -> ReducePath:
    """The ``ReducePath`` of a row's observed path: ZeRO-3's method names are its values; ZeRO-1/2's
    observed methods (``stage_1_and_2.<method>``) are ``STAGE_1_2``, ZeRO-0's (``engine.<method>``)
    ``STAGE_0``."""
    if observed in _REDUCE_PATHS:
        return ReducePath(observed)
    for prefix, path in (("stage_1_and_2", ReducePath.STAGE_1_2), ("engine", ReducePath.STAGE_0)):
        if observed.startswith(prefix):
            return path
    raise ValueError(f"not a reduce path the audit observes: {observed!r}")


@dataclasses.dataclass(frozen=True)
class Judgement:
    known: tuple[str, ...]  # ids of the known discrepancies covering the row
    target: dict[str, float | None]  # expectation -> expected scale (None: "not a scale", see NOT_A_SCALE)
    ok: dict[str, bool]  # expectation -> observed where the expectation puts it
    at_oracle: bool  # observed at 1.0
    at_sp_bug: bool  # __avg_scatter_grads, sp > 1, observed at 1/sp


def judge_row(point_fields: dict[str, Any], path: str, param: str, ratio: float, residual: float,
              known: Sequence[KnownDiscrepancy], version: str | None = None) -> Judgement:
    fields = dict(point_fields, path=path, param=param)
    covering = [k for k in known if k.covers(fields, version)]
    factor = math.prod(k.factor_for(fields) for k in covering)
    not_a_scale = any(not k.is_scale for k in covering)
    sp, dtype = fields["sp"], fields["dtype"]
    target: dict[str, float | None] = {}
    ok = {}
    observed_path = reduce_path(path)
    for e in EXPECTATIONS:
        scale = expected_scale(observed_path, sp, e) * factor
        if not_a_scale:
            target[e] = None
            ok[e] = not at_scale(ratio, residual, scale, dtype) and not at_scale(ratio, residual, 1.0, dtype)
        else:
            target[e] = scale
            ok[e] = at_scale(ratio, residual, scale, dtype)
    sp_bug = bug_scales(observed_path, sp) and at_scale(ratio, residual, 1.0 / sp, dtype)
    return Judgement(tuple(k.id for k in covering), target, ok, at_scale(ratio, residual, 1.0, dtype), sp_bug)


# Point categories, in the order the summary lists them.
CATEGORIES = ("match", "sp_bug", "known", "unexplained", "rejected", "error")


def point_category(status: str, rows: Iterable[Judgement]) -> str:
    """One word for what a point showed, whatever the expectation.

    ``rows``: their judgements (a ``Judgement``, or a judged row of ``repro.audit.report``: the
    same attributes). match: every row at 1.0 (the oracle). sp_bug: every row at 1.0, or reduced
    by __avg_scatter_grads with sp > 1 and at 1/sp with no known discrepancy involved.
    known: every row where the buggy or the fixed expectation, times the known discrepancies
    covering it, puts it, and some row is off 1.0 because of a known discrepancy.
    unexplained: some row is where neither puts it. rejected / error: DeepSpeed refused the
    configuration while building the engine / failed on it.
    """
    if status != "ran":
        return status
    rows = list(rows)
    if not rows:
        return "error"
    if all(r.at_oracle for r in rows):
        return "match"
    if all(r.at_oracle or (r.at_sp_bug and not r.known) for r in rows):
        return "sp_bug"
    if all(r.ok["buggy"] or r.ok["fixed"] for r in rows):
        return "known"
    return "unexplained"


def point_holds(status: str, rows: Iterable[Judgement], expect: str) -> bool:
    """A point keeps the expectation: rejected points do, errors do not, run points when every
    row is at the scale the expectation (with known discrepancies) predicts."""
    if status == "rejected":
        return True
    if status != "ran":
        return False
    rows = list(rows)
    return bool(rows) and all(r.ok[expect] for r in rows)
