"""What the training-effect run covers: stages, recipes, steps, the optimizer and the batches. Pure data.

AdamW without clipping: every run follows (nearly) the reference's trajectory, so a constant gradient scale shows in
the gradient norm (what clipping, logging and SGD-like optimizers see), not in the loss.
"""

from __future__ import annotations

from repro.alst.space import RECIPES as RECIPES, STAGES as STAGES  # re-exported

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
