"""What a downstream client's sequence-parallel loss gets from DeepSpeed: the one rule, and the clients. Pure.

The ratio (DeepSpeed's reduced gradient / the gradient without sequence parallelism) is the client's factor (its
recipe kind, its gate, a division by sp) times DeepSpeed's, through ``repro.harness.scales.expected_scale``. A
client's *gate* decides whether it multiplies its ZeRO-3 share by sp: ``none`` never; ``version`` below a DeepSpeed
release; ``marker-or-version`` unless DeepSpeed sets ``MARKER_NAME = True`` in ``MARKER_MODULE`` or is at least
that release. ``classify`` reads the recipe from the client's source, so a release is judged by what its code does.
docs/code/repro-alst-training-downstream.md has the table.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Literal, NamedTuple, Optional

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from repro.alst.expect import STAGES as STAGES, TORCH_ALL_GATHER  # STAGES: the clients are measured on ALST's
from repro.harness import scales

MARKER_MODULE = "deepspeed.runtime.zero.stage3"
MARKER_NAME = "ZERO3_SP_GRADIENTS_SUMMED"
DEFAULT_GATE_VERSION = "0.20.2"  # transformers 5.25.0's number; classify() reads the client's own
_GATE_RE = re.compile(r"""version\.parse\(\s*["'](\d+\.\d+\.\d+)["']\s*\)""")
# ``loss = loss / <...>sp_size`` or ``loss /= <...>sp_size``: the loss backpropagated is divided by sp.
_DIVIDES_RE = re.compile(r"\bloss\s*(?:=\s*loss\s*/|/=)\s*[\w.]*\bsp_size\b")


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class ClientKind:
    """A client's sp loss recipe, read from its code: what the rule needs."""
    kind: Literal["allgather", "own_share"]
    gate: Literal["none", "version", "marker-or-version"] = "none"
    gate_version: Optional[str] = None  # the release the gate names ("0.20.2"), if any
    divides_by_sp: bool = False  # the loss backpropagated is divided by sp (here or by its caller)


class ClientSpec(NamedTuple):
    """A client of the check: the reports' name, its distribution, and (trl, axolotl) the client whose sp loss it
    hands on, read from ``code_file`` (which must contain ``hands_off``) and changed by ``divides_by_sp``."""
    name: str
    dist: str
    base: str | None = None
    code_file: str = ""
    hands_off: tuple[str, ...] = ()
    divides_by_sp: bool = False
    how: str = ""

    def handed_on(self, kind: ClientKind) -> ClientKind:
        """Its recipe, from that of the client it hands the loss on to."""
        return dataclasses.replace(kind, divides_by_sp=True) if self.divides_by_sp else kind


CLIENTS = (
    ClientSpec("transformers", "transformers"),
    ClientSpec("accelerate", "accelerate"),
    ClientSpec("arctic_training", "arctic-training"),
    ClientSpec("trl", "trl", "transformers", "trl/trainer/sft_trainer.py", ("sp_backend", "super().compute_loss("),
               how="SFTTrainer.compute_loss hands the loss to transformers' Trainer.compute_loss"),
    ClientSpec("axolotl", "axolotl", "transformers", "axolotl/core/trainers/base.py", ("sp_size", ), True,
               "its AxolotlTrainer.compute_loss divides transformers' loss by sp_size"),
)
# The clients judged through the client they hand their sp loss on to (trl and axolotl to transformers).
VIA_CLIENTS = tuple(c for c in CLIENTS if c.base)
# ArcticTraining 0.8.0's SFTTrainer.loss, for a config naming it where arctic_training is not installed.
ARCTIC_LOSS = ClientKind("allgather")


def classify(source: str, caller: str = "") -> ClientKind:
    """The recipe kind and gate of a client's loss function, from its source text; ``caller``: the source of the
    code that backprops what it returns (a trainer's ``compute_loss``), read with it for ``divides_by_sp``."""
    divides = bool(_DIVIDES_RE.search(source) or _DIVIDES_RE.search(caller))
    if TORCH_ALL_GATHER in source:
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
    floor = client.gate_version or DEFAULT_GATE_VERSION
    return not ((client.gate == "marker-or-version" and marker) or Version(deepspeed_version) >= Version(floor))


def expected_ratio(client: ClientKind, stage: int, sp: int, deepspeed_fixed: bool, deepspeed_version: str,
                   marker: bool) -> float:
    """The one rule (``scales.expected_scale``) for this client on DeepSpeed's default path of ``stage``."""
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
