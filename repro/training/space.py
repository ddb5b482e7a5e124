"""What the training-effect run covers: stages, recipes, steps, the optimizer and the batches. Pure data.

Every (stage, recipe) engine trains the tiny Llama (``repro.alst.tiny_llama``) from the same weights on
the same ``STEPS`` batches with AdamW, under Ulysses sequence parallelism, with DeepSpeed's default ZeRO
knobs for the stage (ZeRO-3: ``reduce_scatter=True``, the ``__avg_scatter_grads`` path). A plain-torch
run of the same model, batches and optimizer without sequence parallelism is the reference (the true
gradient). AdamW without clipping: its update is invariant to a constant gradient scale except through
eps, so every run follows (nearly) the same trajectory and the ratio of two runs' gradient norms stays
at the constant the rule predicts on every step; what the scale changes shows in the gradient norm
(what clipping, logging and SGD-like optimizers see), not in the loss.
"""

from __future__ import annotations

from repro.alst.space import RECIPES, STAGES

__all__ = [
    "RECIPES", "STAGES", "STEPS", "DISTINCT_BATCHES", "LR", "EPS", "SEQ_LEN", "MASKED_PREFIX", "BATCH_SEED", "batch"
]

STEPS = 30
DISTINCT_BATCHES = 4  # the steps cycle through these, so the loss falls visibly (the model memorises them)
LR = 1e-3
EPS = 1e-8
SEQ_LEN = 16  # divisible by sp = 2 and 4, like the ALST check's sample
MASKED_PREFIX = 3  # labels[:3] = -100: the sp shards hold different numbers of loss tokens
BATCH_SEED = 8692


def batch(step: int):
    """Step ``step``'s sample: (input_ids, position_ids, labels), each [1, SEQ_LEN]; the same on every rank."""
    import torch

    from repro.alst import tiny_llama

    gen = torch.Generator().manual_seed(BATCH_SEED * 1000 + step % DISTINCT_BATCHES)
    vocab = tiny_llama.TINY_LLAMA_CONFIG["vocab_size"]
    input_ids = torch.randint(2, vocab, (1, SEQ_LEN), generator=gen)
    labels = input_ids.clone()
    labels[:, :MASKED_PREFIX] = -100
    return input_ids, torch.arange(SEQ_LEN).unsqueeze(0), labels
