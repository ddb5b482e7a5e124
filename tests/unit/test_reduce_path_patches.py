"""The reduce-path benchmark times master's fix on the installed 0.19.8: its copy must add master's lines."""

from __future__ import annotations

import re
from pathlib import Path

from patch_and_test.series import load_manifest

ROOT = Path(__file__).resolve().parents[2]
CODE = ("deepspeed/runtime/comm/coalesced_collectives.py", "deepspeed/runtime/zero/stage3.py")


def added_lines(patch: Path) -> dict[str, list[str]]:
    """The '+' lines of each DeepSpeed code file the patch touches, in order."""
    lines: dict[str, list[str]] = {}
    current = None
    for line in patch.read_text().splitlines():
        header = re.match(r"^diff --git a/(\S+) b/", line)
        if header:
            current = header[1]
        elif current in CODE and line.startswith("+") and not line.startswith("+++"):
            lines.setdefault(current, []).append(line)
    return lines


def test_benchmark_divisor_patch_adds_exactly_master_fix_code():
    master = added_lines(load_manifest().by_name("master").fix_patches[0].path)
    copy = added_lines(ROOT / "benchmarks" / "reduce_path_patches" / "divisor-0.19.8.patch")
    assert set(master) == set(CODE) and copy == master


def test_benchmark_rescale_form_is_the_v0_19_8_series_fix():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reduce_path", ROOT / "benchmarks" / "reduce_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.RESCALE_PATCH == load_manifest().by_name("v0.19.8").fix_patches[0].path
    assert module.RECOMMENDED == "divisor"
