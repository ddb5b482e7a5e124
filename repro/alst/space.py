"""What the ALST recipe check covers: the loss recipes (described in docs/alst-recipe.md) and the ZeRO stages, each
on its default config. Pure data."""

from __future__ import annotations

from repro.harness.scales import LOSS_RECIPES

RECIPES = LOSS_RECIPES

STAGES = (2, 3)
