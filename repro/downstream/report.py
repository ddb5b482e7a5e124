"""The downstream check's results: rows, the report (JSON), the table. Pure logic."""

from __future__ import annotations

from pydantic import Field, computed_field

from repro.downstream.expect import ClientKind, mis_scaled
from repro.harness import exit_codes, scales
from repro.harness.report import LaunchReport, Record, text_table


class ClientRow(Record):
    """One client x stage: measured (ratio vs the rule), not applicable (why) or error (last line)."""

    client: str  # "transformers" | "accelerate" | "arctic_training" | "trl" | "axolotl"
    client_version: str
    function: str  # what was called, e.g. "transformers.integrations.deepspeed.deepspeed_sp_compute_loss"
    stage: int | None
    status: str  # "measured" | "not-applicable" | "error"
    kind: str | None = None
    gate: str | None = None
    gate_version: str | None = None
    divides_by_sp: bool | None = None  # the loss backpropagated is divided by sp (the client or its caller)
    reached: str | None = None  # the loss function a wrapping entry (trl, axolotl) was seen to call
    compensates: bool | None = None  # the client multiplied its ZeRO-3 share by sp here
    ratio: float | None = None  # best scalar fit of DeepSpeed's full gradients to the baseline's
    residual: float | None = None  # ||observed - ratio * baseline|| / ||baseline||
    param_ratios: dict[str, float] = Field(default_factory=dict)
    expected: float | None = None  # the rule, under --expect's assumption about DeepSpeed
    matches_rule: bool | None = None
    note: str = ""  # why not applicable, or the error's last line

    @property
    def recipe(self) -> ClientKind:
        return ClientKind(self.kind, self.gate, self.gate_version, bool(self.divides_by_sp))

    @computed_field
    @property
    def verdict(self) -> str:
        if self.status == "not-applicable":
            return f"not applicable: {self.note}"
        if self.status == "error":
            return f"error: {self.note}"
        if not self.matches_rule:
            return f"MISMATCH: rule says {scales.label(self.expected)}"
        if mis_scaled(self.expected):
            return f"mis-scaled x{scales.label(self.expected)} (as the rule predicts)"
        return "true gradient (as the rule predicts)"


class DownstreamReport(LaunchReport):
    """JSON schema ``zero3-sp-gradfix/downstream-clients-report/v1`` (one object):

    script, deepspeed_version, torch_version, python_version   str
    deepspeed_fixed     bool  the installed stage3.py carries the fix (read from its code)
    marker              bool  ``deepspeed.runtime.zero.stage3.ZERO3_SP_GRADIENTS_SUMMED`` is True
    backend, device, launcher, world_size, sp, dp, expect      as in every report
    rows                list  ClientRow objects (its fields, plus ``verdict``)
    extra               dict  model, sample, how the caller's objects were stood in for
    holds               bool  every measured row matches the rule, computed with DeepSpeed fixed
                              (--expect fixed) or unpatched (--expect buggy); no error rows
    exit_code           int   0 holds; 1 does not; 2 an error row; 77 nothing to measure
    """

    SCHEMA = "zero3-sp-gradfix/downstream-clients-report/v1"

    deepspeed_fixed: bool
    marker: bool
    rows: list[ClientRow]

    def table(self) -> str:
        header = ("client", "version", "stage", "ratio", "residual", "rule", "verdict")
        lines = [(r.client, r.client_version, "-" if r.stage is None else f"zero{r.stage}",
                  "-" if r.ratio is None else f"{r.ratio:.6f}", "-" if r.residual is None else f"{r.residual:.1e}",
                  "-" if r.expected is None else scales.label(r.expected), r.verdict) for r in self.rows]
        return "\n".join(text_table(header, lines) + ["", self.summary()])

    def versions(self) -> str:
        return (f"DeepSpeed {self.deepspeed_version} ({deepspeed_label(self.deepspeed_fixed, self.marker)}), "
                f"torch {self.torch_version}")

    def outcome(self) -> str:
        return f"(exit {self.exit_code})"

    @property
    def measured(self) -> list[ClientRow]:
        return [r for r in self.rows if r.status == "measured"]

    @computed_field
    @property
    def holds(self) -> bool:
        return (bool(self.measured) and all(r.matches_rule for r in self.measured)
                and not any(r.status == "error" for r in self.rows))

    @computed_field
    @property
    def exit_code(self) -> int:
        if any(r.status == "error" for r in self.rows):
            return exit_codes.ERROR
        if not self.measured:
            return exit_codes.SKIPPED
        return exit_codes.HOLDS if self.holds else exit_codes.DOES_NOT_HOLD


def deepspeed_label(fixed: bool, marker: bool) -> str:
    if not fixed:
        return "unpatched"
    return "patched, marker" if marker else "patched, no marker"
