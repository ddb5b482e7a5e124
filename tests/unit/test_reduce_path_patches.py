"""The reduce-path benchmark times the fix of the series that serves the installed release: on 0.19.8 that is
the pull request's own patch 1, the one the v0.19.8 backport carries unchanged."""

from __future__ import annotations

import importlib.util
import re

from patch_and_test.core.series import load_manifest, series_for_version
from tests.conftest import ROOT


def _benchmark():
    spec = importlib.util.spec_from_file_location("reduce_path", ROOT / "benchmarks" / "reduce_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def diff_of(path) -> str:
    text = path.read_text().split("\n---\n", 1)[1]
    return re.sub(r"^index \S+", "index", text[text.index("diff --git"):].rsplit("\n-- \n", 1)[0], flags=re.M)


def test_on_the_newest_release_the_benchmark_times_the_pull_requests_fix():
    manifest = load_manifest()
    newest = series_for_version("0.19.8", manifest)
    assert diff_of(newest.fix_patches[0].path) == diff_of(manifest.by_name("master").fix_patches[0].path)
    assert _benchmark().RECOMMENDED == "divisor"


def test_every_served_release_has_a_fix_patch_that_touches_only_what_the_benchmark_loads():
    patched = {"deepspeed/runtime/zero/stage3.py", "deepspeed/runtime/comm/coalesced_collectives.py"}
    for series in load_manifest().series:
        touched = set(re.findall(r"^diff --git a/(deepspeed/\S+) b/", series.fix_patches[0].path.read_text(), re.M))
        assert touched == patched, series.name
