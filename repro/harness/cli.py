"""The command-line contract every reproducer keeps: the common flags, their checks and the exit codes."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from repro.harness import exit_codes

EXIT_CODES_HELP = "exit codes:\n" + "".join(f"  {code:<3} {meaning}\n"
                                            for code, meaning in exit_codes.MEANINGS.items())

LAUNCH_HELP = """\
launch:
  python %(prog)s [flags]                         starts --world-size local ranks itself
  torchrun --nproc_per_node N %(prog)s [flags]    one rank per process, env:// rendezvous
  deepspeed --num_gpus N %(prog)s [flags]         likewise
"""


@dataclasses.dataclass(frozen=True)
class ReproArgs:
    world_size: int
    sp: int
    backend: str  # "gloo" | "nccl"
    expect: str  # "fixed" | "buggy"
    json: Path | None
    timeout: float
    keep_logs: bool
    extra: dict = dataclasses.field(default_factory=dict)  # script-specific flags

    @property
    def dp(self) -> int:
        return self.world_size // self.sp


class UsageError(Exception):
    """Bad flags: one line, exit 2."""


# What --expect means for the gradient-scale reproducers; each other family passes its own wording.
EXPECT_HELP = ("what must hold: fixed: every gradient equals the plain-torch oracle; buggy: exactly the unpatched "
               "pattern (ZeRO-3's __avg_scatter_grads at 1/sp, every other path at the oracle) (default fixed)")


def build_parser(description: str, prog: str | None = None, expect_help: str = EXPECT_HELP) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=LAUNCH_HELP + "\n" + EXIT_CODES_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     conflict_handler="resolve")  # a family may declare a flag again, its way
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks to start for a local launch (default 2; under torchrun its world size wins)")
    parser.add_argument("--sp", type=int, default=2, help="sequence-parallel size; dp = world size / sp (default 2)")
    parser.add_argument(
        "--backend", choices=["gloo", "nccl", "auto"], default="auto",
        help="gloo: CPU ranks; nccl: one GPU per rank (too few GPUs: exit 77); auto: nccl when "
        "there is a GPU for every rank, else gloo (default auto)")
    parser.add_argument("--expect", choices=["fixed", "buggy"], default="fixed", help=expect_help)
    parser.add_argument("--json", type=Path, default=None, help="write the results file here")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="deadline for the whole launch, s (default %(default)s)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the ranks' log folder (local launch)")
    # Passed by the deepspeed launcher to every rank; LOCAL_RANK carries the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def validate(ns: argparse.Namespace) -> ReproArgs:
    world_size = _launcher_world_size() or ns.world_size
    if world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {world_size}")
    if ns.sp < 1:
        raise UsageError(f"--sp must be >= 1, got {ns.sp}")
    if world_size % ns.sp != 0:
        raise UsageError(f"world size {world_size} is not divisible by --sp {ns.sp}")
    if ns.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {ns.timeout}")
    if ns.json is not None:
        _check_writable(ns.json)
    common = {field.name for field in dataclasses.fields(ReproArgs)} | {"local_rank"}  # LOCAL_RANK carries it
    extra = {k: v for k, v in vars(ns).items() if k not in common}
    return ReproArgs(world_size=world_size, sp=ns.sp, backend=resolve_backend(ns.backend, world_size),
                     expect=ns.expect, json=ns.json, timeout=ns.timeout, keep_logs=ns.keep_logs, extra=extra)


def resolve_backend(choice: str, world_size: int) -> str:
    return choice if choice != "auto" else "nccl" if gpu_count() >= world_size else "gloo"


def _check_writable(path: Path) -> None:
    """Refuse an unwritable results file before any rank starts, not after the work."""
    folder = path.parent
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"cannot write the results file {path}: {existing} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot write the results file {path}: {err.strerror or err}") from err
    if path.is_dir() or not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write the results file {path}: not a writable file")


def _launcher_world_size() -> int | None:
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value and value.isdigit() and "RANK" in os.environ else None


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0  #ignore-cuda


def main_guard(description: str, run, add_arguments=None, argv: list[str] | None = None,
               expect_help: str = EXPECT_HELP) -> int:
    parser = build_parser(description, expect_help=expect_help)
    if add_arguments is not None:
        add_arguments(parser)
    try:
        args = validate(parser.parse_args(argv))
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return exit_codes.ERROR
    if args.backend == "nccl" and not _launcher_world_size() and gpu_count() < args.world_size:
        print(f"SKIP: nccl needs one GPU per rank: {args.world_size} ranks, {gpu_count()} GPU(s) visible", flush=True)
        return exit_codes.SKIPPED
    return interruptible(run, args)


def interruptible(run, *args) -> int:
    """``run(*args)``, a Ctrl-C outside a launch exit 130 with one line (during one, the launch stops its ranks and
    says so)."""
    try:
        return run(*args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED
