"""What each audit row should be, and whether it is: tolerances, known discrepancies, judging rows and points.
Pure logic, no torch, no DeepSpeed; docs/parity-audit.md ("Judging") explains the rule and the tolerances."""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from repro.harness.files import load_toml
from repro.harness import scales
from repro.harness.scales import EXPECTATIONS, ReducePath, bug_scales, error_at, expected_scale

KNOWN_SCHEMA = "zero3-sp-gradfix/known-discrepancies/v1"
DEFAULT_KNOWN_FILE = Path(__file__).resolve().with_name("known_discrepancies.toml")

TOLERANCES = scales.TOLERANCES["audit"]  # dtype -> norm-wise relative error allowed


def at_scale(ratio: float, residual: float, scale: float, dtype: str) -> bool:
    """The row is at ``scale`` x the oracle within its dtype's tolerance (``scales.error_at``)."""
    return error_at(ratio, residual, scale) <= TOLERANCES[dtype]


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
# The covered gradients are wrong in direction too (e.g. never reduced): expected only off the predicted scale.
NOT_A_SCALE = "not-a-scale"


def parse_version(text: str):
    """'0.19.8' -> Version('0.19.8'); a local or pre-release suffix ('0.19.8+abc', '0.19.6.dev0') and an epoch are
    dropped: only the release numbers compare (PEP 440, missing ones are 0)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(".".join(map(str, Version(text.strip()).release)))
    except InvalidVersion:
        raise ValueError(f"not a version: {text!r}") from None


_VERSION_CLAUSE = re.compile(r"^\s*(<=|>=|==|<|>)\s*([0-9][0-9A-Za-z.+]*)\s*$")
_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}


def version_matches(version: str, spec: str) -> bool:
    """``spec``: comma-separated clauses, each ``<``, ``<=``, ``>``, ``>=`` or ``==`` a version."""
    v = parse_version(version)
    for clause in spec.split(","):
        if not (match := _VERSION_CLAUSE.match(clause)):
            raise ValueError(f"bad version clause {clause!r} in {spec!r}")
        if not _COMPARE[match.group(1)](v, parse_version(match.group(2))):
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


_REQUIRED = ("id", "title", "when", "factor", "writeup", "code", "upstream", "measured_on")


def load_known(path: Path | str = DEFAULT_KNOWN_FILE, root: Path | None = None) -> list[KnownDiscrepancy]:
    """Read and validate the known-discrepancy file; ``root``: where write-up paths must exist."""
    path = Path(path)
    data = load_toml(path)
    if data.get("schema") != KNOWN_SCHEMA:
        raise ValueError(f"{path}: not a {KNOWN_SCHEMA} file (schema={data.get('schema')!r})")
    out, seen = [], set()
    for entry in data.get("discrepancy", []):
        if missing := [k for k in _REQUIRED if k not in entry]:
            raise ValueError(f"{path}: discrepancy {entry.get('id', '?')!r} lacks {missing}")
        if entry["id"] in seen:
            raise ValueError(f"{path}: duplicate id {entry['id']!r}")
        seen.add(entry["id"])
        if bad := [k for k in entry["when"] if k not in PREDICATE_KEYS]:
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


_REDUCE_PATHS = frozenset(p.value for p in ReducePath)


def reduce_path(observed: str) -> ReducePath:
    """The ``ReducePath`` of a row's observed path (ZeRO-3's method names; ``stage_1_and_2.*``; ``engine.*``)."""
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
    at_oracle = at_scale(ratio, residual, 1.0, dtype)
    target: dict[str, float | None] = {}
    ok = {}
    observed_path = reduce_path(path)
    for e in EXPECTATIONS:
        scale = expected_scale(observed_path, sp, e) * factor
        at = at_scale(ratio, residual, scale, dtype)
        target[e] = None if not_a_scale else scale
        ok[e] = not (at or at_oracle) if not_a_scale else at
    sp_bug = bug_scales(observed_path, sp) and at_scale(ratio, residual, 1.0 / sp, dtype)
    return Judgement(tuple(k.id for k in covering), target, ok, at_oracle, sp_bug)


# Point categories, in the order the summary lists them.
CATEGORIES = ("match", "sp_bug", "known", "unexplained", "rejected", "error")


def point_category(status: str, rows: Iterable[Judgement]) -> str:
    """One word (``CATEGORIES``, docs/parity-audit.md) for what a point showed, whatever the expectation;
    ``rows``: ``Judgement``s or judged rows of ``repro.audit.report`` (the same attributes)."""
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
    """Rejected points keep the expectation, errors do not, run points when every row is where it predicts."""
    if status == "rejected":
        return True
    if status != "ran":
        return False
    rows = list(rows)
    return bool(rows) and all(r.ok[expect] for r in rows)
