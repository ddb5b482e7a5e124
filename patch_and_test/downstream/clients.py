"""Which installed clients mis-scale their sp gradients with the DeepSpeed installed here: ``patch-and-test``'s
warnings, run after the patched build is installed, in a subprocess of its interpreter.

More: docs/code/patch-and-test-downstream-doctor.md
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

from pydantic import TypeAdapter

from repro.downstream.expect import STAGES, ClientKind, classify, expected_ratio, mis_scaled
from repro.downstream.report import deepspeed_label
from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.errors import CommandParser
from repro.harness.files import write_json
from repro.harness.report import Record

SP = 2  # the reproducers' layout; the factor is sp for any sp


@dataclasses.dataclass(frozen=True)
class FoundClient:
    """An installed client and its sp loss recipe: the client check's record, and the doctor's."""
    name: str
    version: str
    function: str
    kind: ClientKind | None  # None: no sp loss code to judge
    note: str = ""  # why not judged, or what the code is (e.g. an example script)


class ClientWarning(Record):
    client: str
    version: str
    function: str
    stage: int
    expected: float
    deepspeed: str
    message: str


def warnings_for(clients: list[FoundClient], deepspeed_version: str, fixed: bool, marker: bool,
                 sp: int = SP) -> list[ClientWarning]:
    """The rule applied to every judged client and stage; one warning per mis-scaled combination. Pure."""
    ds = f"DeepSpeed {deepspeed_version} ({deepspeed_label(fixed, marker)})"
    out = []
    for c in clients:
        for stage in STAGES if c.kind is not None else ():
            value = expected_ratio(c.kind, stage, sp, fixed, deepspeed_version, marker)
            if mis_scaled(value):
                out.append(
                    ClientWarning(
                        client=c.name, version=c.version, function=c.function, stage=stage, expected=value,
                        deepspeed=ds, message=f"{c.name} {c.version} + {ds}, ZeRO-{stage}, sp={sp}: gradients "
                        f"{value:g}x the true gradient ({_why(c.kind, stage, fixed)})" +
                        (f" [{c.note}]" if c.note else "")))
    return out


def _why(kind: ClientKind, stage: int, fixed: bool) -> str:
    if kind.divides_by_sp:
        return ("its trainer divides the sp loss by sp, as if DeepSpeed averaged over the sp ranks" +
                ("; ZeRO-3 without the fix does average, so it is divided twice" if stage == 3 and not fixed else ""))
    if kind.kind == "allgather":
        return "its loss is aggregated with the differentiable all_gather, whose backward sums over the sp ranks"
    if stage == 3 and fixed:
        return (f"it multiplies its ZeRO-3 loss share by sp on its gate '{kind.gate}' (deepspeed < "
                f"{kind.gate_version or '0.20.2'}), which this build meets although it carries the fix; "
                "patch the client (patches/downstream/transformers) or see docs/backport-clients.md")
    return "ZeRO-3 without the fix averages over the sp ranks"


def found_clients() -> list[FoundClient]:
    """The installed clients, read with the reproducer's own readers (imports transformers if installed)."""
    from repro.downstream import measure

    out = []
    for c in measure.find_clients():
        if c.error:
            out.append(FoundClient(c.name, c.version, c.function, None, f"import failed: {c.error}"))
        elif c.kind is not None:
            out.append(FoundClient(c.name, c.version, c.function, c.kind))
        elif c.name == "accelerate" and c.function == measure.ACCELERATE_SCRIPT:
            # Not callable, but users copy it: judge the recipe it shows.
            text = Path(importlib.util.find_spec(c.function).origin).read_text()
            out.append(
                FoundClient(c.name, c.version, c.function, classify(text),
                            "its ALST example script's recipe, for code that copies it"))
        else:
            out.append(FoundClient(c.name, c.version, c.function, None, c.why_not))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="zero3-sp downstream check-installed", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None, help="write {clients, warnings} here")
    args = parser.parse_args(argv)
    from repro.downstream import measure

    fixed, marker = measure.deepspeed_state()
    version = measure.dist_version("deepspeed") or "none"
    clients = found_clients()
    warnings = warnings_for(clients, version, fixed, marker)
    for w in warnings:
        print(f"WARNING: {w.message}", flush=True)
    if not warnings:
        print(f"no known mis-scaling: {', '.join(f'{c.name} {c.version}' for c in clients) or 'no client installed'}")
    if args.json is not None:
        state = dict(version=version, fixed=fixed, marker=marker)
        write_json(
            args.json,
            dict(deepspeed=state, clients=[dataclasses.asdict(c) for c in clients],
                 warnings=[w.model_dump(mode="json") for w in warnings]))
    return 0


def run_check(out_dir: Path, timeout: float = 300.0) -> tuple[list[ClientWarning], str | None, Path]:
    """Run this check in a subprocess of this interpreter: (warnings, error line or None, log)."""
    from patch_and_test.core.checks import run_logged

    out_dir.mkdir(parents=True, exist_ok=True)
    report, log = out_dir / "client_check.json", out_dir / "client_check.log"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "patch_and_test", "downstream", "check-installed", "--json", str(report)]
    code, _ = run_logged(cmd, log, timeout=timeout, cwd=PACKAGE_ROOT)
    if code != 0 or not report.exists():
        return [], f"client check exited {code} (log: {log})", log
    return TypeAdapter(list[ClientWarning]).validate_python(json.loads(report.read_text())["warnings"]), None, log
