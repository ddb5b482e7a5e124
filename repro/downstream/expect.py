"""What a downstream client's sequence-parallel loss gets from DeepSpeed: the one rule. Pure logic.

The ratio (DeepSpeed's reduced gradient / the gradient without sequence parallelism) is the client's factor (its
recipe kind, its gate, a division by sp) times DeepSpeed's, through ``repro.harness.scales.expected_scale``; this
module reads the client's side from its source (``classify``), so a release is judged by what its code does, not
by its number. docs/code/repro-alst-training-downstream.md has the table.
"""

from __future__ import annotations

import dataclasses
import math
import re

from repro.downstream.space import GATES, KINDS, MARKER_NAME, STAGES
from repro.harness import scales

DEFAULT_GATE_VERSION = "0.20.2"  # transformers 5.25.0's number; classify() reads the client's own
_ALL_GATHER = "torch.distributed.nn.functional.all_gather"
_GATE_RE = re.compile(r"""version\.parse\(\s*["'](\d+\.\d+\.\d+)["']\s*\)""")
# ``loss = loss / <...>sp_size`` or ``loss /= <...>sp_size``: the loss backpropagated is divided by sp.
_DIVIDES_RE = re.compile(r"\bloss\s*(?:=\s*loss\s*/|/=)\s*[\w.]*\bsp_size\b")


@dataclasses.dataclass(frozen=True)
class ClientKind:
    """What a client's sp loss code does, read from its source."""

    kind: str  # "allgather" | "own_share"
    gate: str  # "none" | "version" | "marker-or-version"
    gate_version: str | None = None  # the release the gate names ("0.20.2"), if any
    divides_by_sp: bool = False  # the loss backpropagated is divided by sp (here or by its caller)


def classify(source: str, caller: str = "") -> ClientKind:
    """The recipe kind and gate of a client's loss function, from its source text; ``caller``: the source of the
    code that backprops what it returns (a trainer's ``compute_loss``), read with it for ``divides_by_sp``."""
    divides = bool(_DIVIDES_RE.search(source) or _DIVIDES_RE.search(caller))
    if _ALL_GATHER in source:
        return ClientKind("allgather", "none", divides_by_sp=divides)
    found = _GATE_RE.search(source)
    gate_version = found.group(1) if found else None
    if MARKER_NAME in source:
        return ClientKind("own_share", "marker-or-version", gate_version, divides)
    if gate_version is not None and "sp_size" in source:
        return ClientKind("own_share", "version", gate_version, divides)
    return ClientKind("own_share", "none", divides_by_sp=divides)


def compensates(client: ClientKind, deepspeed_version: str, marker: bool) -> bool:
    """Whether the client multiplies its ZeRO-3 share by sp with this DeepSpeed."""
    from packaging.version import Version

    if client.kind != "own_share" or client.gate == "none":
        return False
    if client.gate not in GATES:
        raise ValueError(f"unknown gate {client.gate!r}; known: {', '.join(GATES)}")
    floor = client.gate_version or DEFAULT_GATE_VERSION
    return not ((client.gate == "marker-or-version" and marker) or Version(deepspeed_version) >= Version(floor))


def expected_ratio(client: ClientKind, stage: int, sp: int, deepspeed_fixed: bool, deepspeed_version: str,
                   marker: bool) -> float:
    """The one rule (``scales.expected_scale``) for this client on DeepSpeed's default path of ``stage``."""
    if client.kind not in KINDS:
        raise ValueError(f"unknown recipe kind {client.kind!r}; known: {', '.join(KINDS)}")
    if stage not in STAGES:
        raise ValueError(f"stage {stage} is not covered by the rule; known: {STAGES}")
    return client_scale(client, scales.default_path(stage), stage, sp, "fixed" if deepspeed_fixed else "buggy",
                        deepspeed_version, marker)


def client_scale(client: ClientKind, path: scales.ReducePath, stage: int, sp: int, expect: str, deepspeed_version: str,
                 marker: bool) -> float:
    """The one rule for a client's loss on ``path``: its recipe's factor, DeepSpeed's (``expect``: fixed or buggy),
    and its ZeRO-3 gate for this DeepSpeed; sp < 1 is a ValueError (scales)."""
    gate = stage == 3 and compensates(client, deepspeed_version, marker)
    return scales.expected_scale(path, sp, expect, recipe=client.kind, compensates=gate,
                                 divides_by_sp=client.divides_by_sp)


def mis_scaled(expected: float) -> bool:
    return not math.isclose(expected, 1.0, rel_tol=1e-9)
