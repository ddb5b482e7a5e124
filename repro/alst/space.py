"""What the ALST recipe check covers: the loss recipes and the ZeRO stages. Pure data.

Recipes (what each sp rank passes to ``engine.backward``):

* ``allgather``: DeepSpeed's ALST recipe (tutorial ``ulysses-alst-sequence-parallelism.md``,
  ``tests/unit/ulysses_alst/test_ulysses_sp_hf.py``): the shard losses are gathered with the
  differentiable ``torch.distributed.nn.functional.all_gather``, weighted by their tokens, and
  every rank backprops that same full-sequence loss. The all_gather's backward sums the sp
  ranks' identical upstream gradients, so each rank's local gradient is sp times its share.
* ``own_share``: each rank backprops only its own token-weighted share,
  ``loss_r * tokens_r / sum(tokens)`` (the token total from a non-differentiable all_reduce),
  which is the convention DeepSpeed's reductions assume: sum over sp, mean over dp.

Stages: ZeRO-2 and ZeRO-3, each with its default config (ZeRO-3: ``reduce_scatter=True``, the
``__avg_scatter_grads`` path the bug is on).
"""

from __future__ import annotations

from repro.harness.scales import LOSS_RECIPES

RECIPES = LOSS_RECIPES

STAGES = (2, 3)
