"""What a gradient sp times larger does to the update: Adam/AdamW, clipping, SGD. Plain torch, one process.

Two copies of the tiny Llama (repro/alst/tiny_llama.py) train on the same batches, one on ``loss`` and one on
``sp * loss`` (the ALST all_gather recipe's ZeRO-3 gradient after the fix); after N steps it reports how far the
parameters moved apart, relative to how far they moved at all. Adam's update is invariant to a constant gradient
scale except through eps; clipping is, only while it is active on every step in both runs; SGD's update is sp times
larger. The measured numbers: docs/downstream-notice.md.

Usage: python repro/alst_optimizer_effect.py [--sp 2] [--steps 20] [--json FILE]. Needs transformers.
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
from pathlib import Path

from repro.alst import measure, tiny_llama
from repro.harness import exit_codes
from repro.harness.files import write_json


def _batches(steps: int):
    """``steps`` samples as the ALST check draws them (``measure.tokens``), in turn from one seeded generator."""
    import torch

    gen = torch.Generator().manual_seed(8692)
    return [measure.tokens(gen) for _ in range(steps)]


def _flat(model):
    import torch

    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def run(optimizer: str, sp: int, steps: int, clip: float | None) -> dict:
    import torch

    base = tiny_llama.make_model()
    start = _flat(base)
    models = {1: base, sp: copy.deepcopy(base)}
    make = (functools.partial(torch.optim.SGD, lr=1e-2) if optimizer == "sgd" else functools.partial(
        torch.optim.AdamW, lr=1e-3, eps=1e-8, weight_decay=0.0))
    opts = {scale: make(model.parameters()) for scale, model in models.items()}
    norms, clipped = {1: [], sp: []}, {"1x": 0, f"{sp}x": 0}
    for ids, _, labels in _batches(steps):
        for scale, model in models.items():
            opts[scale].zero_grad()
            (scale * model(input_ids=ids, labels=labels).loss).backward()
            if clip is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
                clipped[f"{scale}x"] += norm > clip
            else:
                norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
            norms[scale].append(norm)
            opts[scale].step()
    moved = _flat(models[1]) - start
    moved_scaled = _flat(models[sp]) - start
    return {
        "optimizer": optimizer,
        "sp": sp,
        "steps": steps,
        "clip_max_norm": clip,
        "grad_norm_ratio_first_step": norms[sp][0] / norms[1][0],
        "steps_clipped": clipped,
        "update_norm_1x": float(moved.norm()),
        f"update_norm_{sp}x": float(moved_scaled.norm()),
        "update_rel_diff": float((moved_scaled - moved).norm() / moved.norm()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sp", type=int, default=2, help="the gradient scale tried, sp (default 2)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run (default 20)")
    parser.add_argument("--json", type=Path, help="write the results file here")
    args = parser.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP: transformers is not installed")
        return exit_codes.SKIPPED
    results = [
        run(opt, args.sp, args.steps, clip)
        for opt, clip in (("adamw", None), ("adamw", 1.0), ("adamw", 2.0), ("sgd", None))
    ]
    for r in results:
        print(f"{r['optimizer']:<5} clip={str(r['clip_max_norm']):<4} "
              f"grad norm x{r['grad_norm_ratio_first_step']:.3f}  "
              f"steps clipped {r['steps_clipped']}  update rel diff {r['update_rel_diff']:.2e}  "
              f"(|update| {r['update_norm_1x']:.4e} vs {r[f'update_norm_{args.sp}x']:.4e})")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
