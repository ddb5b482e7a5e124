"""What a downstream client's sequence-parallel loss gets from DeepSpeed: the one rule. Pure logic.

A client (HF transformers' Trainer, ArcticTraining's SFTTrainer, ...) turns the shard losses of
the sp ranks into the tensor each rank backprops; DeepSpeed then reduces the ranks' gradients.
The gradient the optimizer sees, divided by the gradient of the same samples without sequence
parallelism (the *ratio*), is the product of two factors:

* the client's factor ``m`` (the sum over the sp ranks of their local gradients / the true gradient):

  | recipe kind  | what each rank backprops                                   | m                        |
  |--------------|------------------------------------------------------------|--------------------------|
  | ``allgather``| the full-sequence loss, aggregated with the differentiable | sp (its backward sums    |
  |              | ``torch.distributed.nn.functional.all_gather``             | over the sp ranks)       |
  | ``own_share``| its own token-weighted share of the loss                   | 1, or sp under ZeRO-3    |
  |              |                                                            | when its gate compensates|

* DeepSpeed's factor ``r`` (the reduced gradient / the sum over sp of the local gradients):
  1 under ZeRO-1/2; under ZeRO-3's default path (``reduce_scatter: true``,
  ``__avg_scatter_grads``) 1/sp without the fix and 1 with it.

A client *compensates* when it multiplies its ZeRO-3 share by sp because it believes DeepSpeed
averages over sp. Its gate decides that:

* ``none``: never (the allgather recipes; ``own_share`` without a gate).
* ``version``: transformers 5.25.0: ``deepspeed < 0.20.2`` (read from the client's source).
  A patched build keeps its release number (``0.19.8``, ``0.19.6+<hash>``), so it compensates
  for a bug that is no longer there.
* ``marker-or-version``: the proposed transformers patch (``patches/downstream/transformers``):
  compensates unless DeepSpeed exposes ``ZERO3_SP_GRADIENTS_SUMMED = True`` in
  ``deepspeed.runtime.zero.stage3`` or is ``>= 0.20.2``.

expected ratio = m * r. A ratio of 1.0 is the true gradient; anything else is mis-scaled.
The recipe kind and gate are read from the client's own function source (``classify``), so a
release that changes its loss code is classified by what it does, not by its number.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import re
from fractions import Fraction
from typing import Any

from repro.harness import exit_codes
from repro.report import JsonReport

KINDS = ("allgather", "own_share")
GATES = ("none", "version", "marker-or-version")
STAGES = (2, 3)
MARKER_MODULE = "deepspeed.runtime.zero.stage3"
MARKER_NAME = "ZERO3_SP_GRADIENTS_SUMMED"
DEFAULT_GATE_VERSION = "0.20.2"  # transformers 5.25.0's number; classify() reads the client's own
_ALL_GATHER = "torch.distributed.nn.functional.all_gather"
_GATE_RE = re.compile(r"""version\.parse\(\s*["'](\d+\.\d+\.\d+)["']\s*\)""")


@dataclasses.dataclass(frozen=True)
class ClientKind:
    """What a client's sp loss code does, read from its source."""

    kind: str  # "allgather" | "own_share"
    gate: str  # "none" | "version" | "marker-or-version"
    gate_version: str | None = None  # the release the gate names ("0.20.2"), if any


def classify(source: str) -> ClientKind:
    """The recipe kind and gate of a client's loss function, from its source text.

    allgather: it calls the differentiable all_gather. Otherwise own_share; its gate is
    ``marker-or-version`` when it reads the capability marker, ``version`` when it multiplies
    by ``sp_size`` under a ``version.parse("X")`` comparison, else ``none``.
    """
    if _ALL_GATHER in source:
        return ClientKind("allgather", "none")
    found = _GATE_RE.search(source)
    gate_version = found.group(1) if found else None
    if MARKER_NAME in source:
        return ClientKind("own_share", "marker-or-version", gate_version)
    if gate_version is not None and "sp_size" in source:
        return ClientKind("own_share", "version", gate_version)
    return ClientKind("own_share", "none")


def _version_at_least(version: str, floor: str) -> bool:
    from packaging.version import Version

    return Version(version) >= Version(floor)


def compensates(client: ClientKind, deepspeed_version: str, marker: bool) -> bool:
    """Whether the client multiplies its ZeRO-3 share by sp with this DeepSpeed."""
    if client.kind != "own_share" or client.gate == "none":
        return False
    floor = client.gate_version or DEFAULT_GATE_VERSION
    if client.gate == "version":
        return not _version_at_least(deepspeed_version, floor)
    if client.gate == "marker-or-version":
        return not (marker or _version_at_least(deepspeed_version, floor))
    raise ValueError(f"unknown gate {client.gate!r}; known: {', '.join(GATES)}")


def expected_ratio(client: ClientKind, stage: int, sp: int, deepspeed_fixed: bool, deepspeed_version: str,
                   marker: bool) -> float:
    """The one rule: the client's factor times DeepSpeed's factor (module docstring)."""
    if client.kind not in KINDS:
        raise ValueError(f"unknown recipe kind {client.kind!r}; known: {', '.join(KINDS)}")
    if stage not in STAGES:
        raise ValueError(f"stage {stage} is not covered by the rule; known: {STAGES}")
    if sp < 1:
        raise ValueError(f"sp must be >= 1, got {sp}")
    if client.kind == "allgather":
        m = Fraction(sp)
    else:
        m = Fraction(sp) if stage == 3 and compensates(client, deepspeed_version, marker) else Fraction(1)
    r = Fraction(1, sp) if stage == 3 and not deepspeed_fixed else Fraction(1)
    return float(m * r)


def mis_scaled(expected: float) -> bool:
    return not math.isclose(expected, 1.0, rel_tol=1e-9)


# ----------------------------------------------------------------------------- rows and report

SCHEMA = "zero3-sp-gradfix/downstream-clients-report/v1"
STATUSES = ("measured", "not-applicable", "error")


@dataclasses.dataclass(frozen=True)
class ClientRow:
    """One client x stage: measured (ratio vs the rule), not applicable (why) or error (last line)."""

    client: str  # "transformers" | "accelerate" | "arctic_training"
    client_version: str
    function: str  # what was called, e.g. "transformers.integrations.deepspeed.deepspeed_sp_compute_loss"
    stage: int | None
    status: str  # one of STATUSES
    kind: str | None = None
    gate: str | None = None
    gate_version: str | None = None
    compensates: bool | None = None  # the client multiplied its ZeRO-3 share by sp here
    ratio: float | None = None  # best scalar fit of DeepSpeed's full gradients to the baseline's
    residual: float | None = None  # ||observed - ratio * baseline|| / ||baseline||
    param_ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    expected: float | None = None  # the rule, under --expect's assumption about DeepSpeed
    matches_rule: bool | None = None
    note: str = ""  # why not applicable, or the error's last line

    @property
    def verdict(self) -> str:
        if self.status == "not-applicable":
            return f"not applicable: {self.note}"
        if self.status == "error":
            return f"error: {self.note}"
        if not self.matches_rule:
            return f"MISMATCH: rule says {_num(self.expected)}"
        if mis_scaled(self.expected):
            return f"mis-scaled x{_num(self.expected)} (as the rule predicts)"
        return "true gradient (as the rule predicts)"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}" if value != int(value) else f"{value:.1f}"


@dataclasses.dataclass
class DownstreamReport(JsonReport):
    """JSON schema ``zero3-sp-gradfix/downstream-clients-report/v1`` (one object):

    script, deepspeed_version, torch_version, python_version   str
    deepspeed_fixed     bool  the installed stage3.py carries the fix (read from its code)
    marker              bool  ``deepspeed.runtime.zero.stage3.ZERO3_SP_GRADIENTS_SUMMED`` is True
    backend, device, launcher, world_size, sp, dp, expect      as in every report
    rows                list  ClientRow objects (fields as in the dataclass, plus ``verdict``)
    extra               dict  model, sample, how the caller's objects were stood in for
    holds               bool  every measured row matches the rule, computed with DeepSpeed fixed
                              (--expect fixed) or unpatched (--expect buggy); no error rows
    exit_code           int   0 holds; 1 does not; 2 an error row; 77 nothing to measure
    """

    script: str
    deepspeed_version: str
    deepspeed_fixed: bool
    marker: bool
    torch_version: str
    backend: str
    device: str
    launcher: str
    world_size: int
    sp: int
    dp: int
    expect: str
    rows: list[ClientRow]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    python_version: str = dataclasses.field(default_factory=platform.python_version)
    wall_time_s: float | None = None
    schema: str = SCHEMA

    SCHEMA = SCHEMA
    DERIVED = ("holds", "exit_code")

    @property
    def measured(self) -> list[ClientRow]:
        return [r for r in self.rows if r.status == "measured"]

    @property
    def holds(self) -> bool:
        return (bool(self.measured) and all(r.matches_rule for r in self.measured)
                and not any(r.status == "error" for r in self.rows))

    @property
    def exit_code(self) -> int:
        if any(r.status == "error" for r in self.rows):
            return exit_codes.ERROR
        if not self.measured:
            return exit_codes.SKIPPED
        return exit_codes.HOLDS if self.holds else exit_codes.DOES_NOT_HOLD

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for row, obj in zip(data["rows"], self.rows):
            row["verdict"] = obj.verdict
        return data

    @classmethod
    def _nested(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(ClientRow)}
        return {**kwargs, "rows": [ClientRow(**{k: v for k, v in r.items() if k in names}) for r in kwargs["rows"]]}


def deepspeed_label(fixed: bool, marker: bool) -> str:
    if not fixed:
        return "unpatched"
    return "patched, marker" if marker else "patched, no marker"


def render_table(report: DownstreamReport) -> str:
    header = ("client", "version", "stage", "ratio", "residual", "rule", "verdict")
    lines = [(r.client, r.client_version, "-" if r.stage is None else f"zero{r.stage}",
              "-" if r.ratio is None else f"{r.ratio:.6f}", "-" if r.residual is None else f"{r.residual:.1e}",
              _num(r.expected), r.verdict) for r in report.rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line).rstrip() for line in lines]
    summary = (f"{report.script}: DeepSpeed {report.deepspeed_version} "
               f"({deepspeed_label(report.deepspeed_fixed, report.marker)}), torch {report.torch_version}, "
               f"{report.backend}, world {report.world_size} (sp={report.sp}, dp={report.dp}), "
               f"--expect {report.expect}: {'HOLDS' if report.holds else 'DOES NOT HOLD'} (exit {report.exit_code})")
    if report.wall_time_s is not None:
        summary += f", {report.wall_time_s:.1f} s"
    return "\n".join(out + ["", summary])
