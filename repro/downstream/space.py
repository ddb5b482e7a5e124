"""What the downstream check covers: the clients, their recipe kinds and gates, the ZeRO stages. Pure data.

A client's *gate* decides whether it compensates (multiplies its ZeRO-3 share by sp): ``none`` never; ``version``
below a DeepSpeed release (transformers 5.25.0: ``< 0.20.2``); ``marker-or-version`` unless DeepSpeed exposes
``MARKER_NAME = True`` in ``MARKER_MODULE`` or is at least that release (``patches/downstream/transformers``).
"""

from __future__ import annotations

from repro.harness.scales import LOSS_RECIPES

KINDS = LOSS_RECIPES  # a client's recipe kind
GATES = ("none", "version", "marker-or-version")
STAGES = (2, 3)
MARKER_MODULE = "deepspeed.runtime.zero.stage3"
MARKER_NAME = "ZERO3_SP_GRADIENTS_SUMMED"
