"""python -m repro.training.figure --unpatched U.json --patched P.json --out FIG.png

Draws two training-effect reports (``repro/training_effect.py`` on unpatched and on patched DeepSpeed)
into one figure: a column per loss recipe; top row the gradient norm per step (log scale, what gradient
clipping and logging see), bottom row the loss; the plain-torch reference (the true gradient) in black.
Needs matplotlib (requirements/figure.txt), not torch or DeepSpeed. Exit 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.harness import exit_codes, scales
from repro.training.report import RECIPES, TrainingReport

TITLES = {
    "allgather": "recipe: differentiable all_gather of the loss (ALST tutorial)",
    "own_share": "recipe: each rank backprops its own token-weighted share"
}
# (stage, patched) -> colour, line style, marker: lines that coincide stay visible (solid under dashed).
STYLE = {
    (2, False): ("tab:blue", "-", None),
    (2, True): ("tab:cyan", "--", "o"),
    (3, False): ("tab:red", "-", None),
    (3, True): ("tab:orange", "--", "s")
}


def load_pair(unpatched: Path, patched: Path) -> tuple[TrainingReport, TrainingReport]:
    reports = []
    for path, fixed in ((unpatched, False), (patched, True)):
        try:
            report = TrainingReport.load(path)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a training-effect report: {str(err).splitlines()[0]}") from None
        if report.deepspeed_fixed != fixed:
            raise ValueError(f"{path}: its DeepSpeed {'carries' if report.deepspeed_fixed else 'lacks'} the fix; "
                             f"expected the {'patched' if fixed else 'unpatched'} run")
        reports.append(report)
    return reports[0], reports[1]


def draw(unpatched: TrainingReport, patched: TrainingReport, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(RECIPES), figsize=(12, 7.5), sharex=True)
    steps = [s.step for s in unpatched.reference]
    for col, recipe in enumerate(RECIPES):
        norm_ax, loss_ax = axes[0][col], axes[1][col]
        norm_ax.plot(steps, [s.grad_norm for s in unpatched.reference], color="black", lw=2.5, alpha=0.35,
                     label="reference, no sp (true gradient)")
        loss_ax.plot(steps, [s.loss for s in unpatched.reference], color="black", lw=2.5, alpha=0.35,
                     label="reference, no sp")
        for report, patched_build in ((unpatched, False), (patched, True)):
            for run in (r for r in report.runs if r.recipe == recipe):
                colour, style, marker = STYLE[(run.stage, patched_build)]
                factor = report.check(run, "fixed" if patched_build else "buggy").factor
                label = (f"ZeRO-{run.stage}, DeepSpeed {'patched' if patched_build else 'unpatched'} "
                         f"(x{scales.label(factor)})")
                kwargs = dict(color=colour, ls=style, marker=marker, markevery=5, ms=4, lw=1.4)
                norm_ax.plot(steps, [s.grad_norm for s in run.steps], label=label, **kwargs)
                loss_ax.plot(steps, [s.loss for s in run.steps], label=label.split(" (")[0], **kwargs)
        norm_ax.set_yscale("log", base=2)
        norm_ax.set_ylim(0.5, 16)  # both panels on one scale; room above the lines for the legend
        norm_ax.set_yticks([0.5, 1, 2, 4, 8, 16], ["1/2", "1", "2", "4", "8", "16"])
        norm_ax.set_title(TITLES[recipe], fontsize=10)
        norm_ax.set_ylabel("gradient norm (log2 scale)")
        loss_ax.set_ylabel("loss")
        loss_ax.set_xlabel("step")
        norm_ax.legend(fontsize=7.5, loc="upper center", ncol=2)
        loss_ax.legend(fontsize=7.5, loc="upper right")
        norm_ax.grid(True, which="both", alpha=0.3)
        loss_ax.grid(True, alpha=0.3)
    fig.suptitle(
        f"Tiny Llama, sp={unpatched.sp}, AdamW lr {unpatched.extra.get('lr')}, same batches: DeepSpeed "
        f"{unpatched.deepspeed_version} unpatched vs patched", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.training.figure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unpatched", type=Path, required=True, help="training-effect report of unpatched DeepSpeed")
    parser.add_argument("--patched", type=Path, required=True, help="training-effect report of patched DeepSpeed")
    parser.add_argument("--out", type=Path, required=True, help="the figure (PNG) to write")
    args = parser.parse_args(argv)
    try:
        unpatched, patched = load_pair(args.unpatched, args.patched)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return exit_codes.ERROR
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("error: matplotlib is not installed (pip install -r requirements/figure.txt)", file=sys.stderr)
        return exit_codes.ERROR
    print(draw(unpatched, patched, args.out))
    return exit_codes.HOLDS


if __name__ == "__main__":
    sys.exit(main())
