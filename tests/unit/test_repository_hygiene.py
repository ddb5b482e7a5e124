"""What the repository keeps is this repository's: no facts referred to outside it, no machine's folders."""

from __future__ import annotations

import importlib.util
import re
import sys

from tests.conftest import ROOT, tracked_files

MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home|tmp)/")
# A reference to notes kept outside the repository. Spelt in pieces, so that this file is not one.
NOTES_ELSEWHERE = re.compile("|".join(["FIND" + "INGS", r"\.\./" + "shared", "see " + "shared"]))


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_common", module)
    spec.loader.exec_module(module)
    return module


def test_no_reference_to_notes_outside_the_repository():
    # Facts the code relies on are in docs/; a finding kept elsewhere is not there for a reader.
    found = []
    for path in tracked_files("*.py", "*.md", "*.toml", "*.ini", "*.txt"):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if NOTES_ELSEWHERE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, found


def test_kept_results_name_no_folder_of_this_machine():
    kept = tracked_files("benchmarks/results/*.json", "benchmarks/results/**/*.json", "docs/*.json", "docs/**/*.json",
                         "tests/fixtures/**")
    assert any("benchmarks/results" in str(p) for p in kept) and any("tests/fixtures" in str(p) for p in kept)
    found = [f"{p.relative_to(ROOT)}: {m[0]}" for p in kept for m in MACHINE_PATH.finditer(p.read_text())]
    assert not found, found


def test_results_are_written_with_versions_not_paths(tmp_path):
    common = _common()
    from patch_and_test.review.benchmark_reports import Environment, LaunchCost, Timed

    env = Environment(python=sys.executable, deepspeed="1.2.3", torch="4.5.6", platform="Linux", cpus=2,
                      load_average_at_start=[1.5, 2.0, 2.0])
    run = Timed(argv=[str(common.ROOT / "results" / "benchmarks" / "run" / "verdict.json")], returncode=0,
                wall_s=12.25, teardown_notes=0, stderr_tail=f'File "{sys.base_prefix}/lib/x.py", line 3')
    result = LaunchCost(benchmark="x", environment=env, target=1.5, meets_target=True, repeats=1,
                        median_wall_s={"single": 12.25}, ratio_all_six_over_single=1.0, runs={"single": [run]})
    written = common.write_result(result, tmp_path / "x.json").read_text()
    assert not MACHINE_PATH.search(written.replace(str(tmp_path), "")), written
    assert '"results/benchmarks/run/verdict.json"' in written and '"wall_s": 12.25' in written
    assert '"<python>/' in written and LaunchCost.load(tmp_path / "x.json").runs["single"][0].wall_s == 12.25


def test_the_mirror_is_the_users_not_a_built_in_folder(monkeypatch, tmp_path):
    from patch_and_test.core import source

    assert not hasattr(source, "DEFAULT_MIRROR")
    monkeypatch.setenv("DEEPSPEED_MIRROR", str(tmp_path / "ds.git"))
    assert source.mirror_path() == tmp_path / "ds.git"
    monkeypatch.delenv("DEEPSPEED_MIRROR")
    monkeypatch.setenv("ZERO3_SP_CACHE", str(tmp_path / "cache"))
    assert source.mirror_path().name == "deepspeed-mirror"
