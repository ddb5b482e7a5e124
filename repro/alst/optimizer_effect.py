"""What a gradient sp times larger does to the update: Adam/AdamW, clipping, SGD. Plain torch, one process.

The ZeRO-3 fix multiplies every gradient that users of the ALST all_gather recipe get under
ZeRO-3 by sp (it was 1/sp of ZeRO-1/2's and cancelled the recipe's double count). This
script trains two copies of the tiny Llama (repro/alst/tiny_llama.py) on the same batches, one on
``loss`` and one on ``sp * loss``, and reports after N steps how far the parameters moved
apart, relative to how far they moved at all:

* Adam/AdamW: the update m / (sqrt(v) + eps) is invariant to a constant gradient scale except
  through eps, so the difference is of order eps / sqrt(v) (~1e-4 here, where gradient entries
  are ~1e-4; smaller on real models with larger gradients, larger where gradients are tiny).
* Adam + clip_grad_norm(max_norm): the norm is sp times larger; while clipping is active the
  scaled run's gradient is divided by a per-step factor sp times larger, which is again a
  constant only if clipping is active on every step in both runs. Where it kicks in for one run
  and not the other, the trajectories differ for real.
* SGD: the update is sp times larger (the effective learning rate is sp times larger).

Usage: python repro/alst_optimizer_effect.py [--sp 2] [--steps 20] [--json FILE]. Needs transformers.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from repro.alst import tiny_llama
from repro.harness import exit_codes
from repro.harness.files import write_json


def _batches(steps: int, seq_len: int = 16):
    import torch

    gen = torch.Generator().manual_seed(8692)
    vocab = tiny_llama.TINY_LLAMA_CONFIG["vocab_size"]
    for _ in range(steps):
        ids = torch.randint(2, vocab, (1, seq_len), generator=gen)
        labels = ids.clone()
        labels[:, :3] = -100
        yield ids, labels


def _flat(model):
    import torch

    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def run(optimizer: str, sp: int, steps: int, clip: float | None) -> dict:
    import torch

    base = tiny_llama.make_model()
    start = _flat(base)
    models = {1: base, sp: copy.deepcopy(base)}
    opts = {}
    for scale, model in models.items():
        if optimizer == "sgd":
            opts[scale] = torch.optim.SGD(model.parameters(), lr=1e-2)
        else:
            opts[scale] = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-8, weight_decay=0.0)
    norms = {1: [], sp: []}
    clipped = {1: 0, sp: 0}
    for ids, labels in _batches(steps):
        for scale, model in models.items():
            opts[scale].zero_grad()
            (scale * model(input_ids=ids, labels=labels).loss).backward()
            if clip is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
                clipped[scale] += norm > clip
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
        "steps_clipped": {
            "1x": clipped[1],
            f"{sp}x": clipped[sp]
        },
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
        run("adamw", args.sp, args.steps, None),
        run("adamw", args.sp, args.steps, 1.0),
        run("adamw", args.sp, args.steps, 2.0),
        run("sgd", args.sp, args.steps, None)
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
