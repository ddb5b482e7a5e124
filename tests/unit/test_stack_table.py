"""README's opening table (patch_and_test.downstream.stacks) is rendered from the kept runs, near the top, and
refuses a number the runs do not support."""

from __future__ import annotations

import json
import shutil

import pytest

from patch_and_test.downstream import stacks
from patch_and_test.review import docs
from repro.downstream.expect import ClientKind
from patch_and_test.downstream.table import KEPT_RESULTS

README = stacks.DOCUMENT.read_text()


def test_readmes_block_is_the_kept_runs_rendered_and_a_hand_edit_shows(tmp_path):
    [splice] = [a.render for a in docs.ARTIFACTS if a.name == "stack table"]  # what zero3-sp docs writes
    assert splice(stacks.DOCUMENT) == {stacks.DOCUMENT: README}, "README.md's stack table is stale: run zero3-sp docs"
    row = "| your own loss: each rank's own share | 1 | 1/2 | 1 |"
    assert row in README
    edited = tmp_path / "README.md"
    edited.write_text(README.replace(row, "| your own loss: each rank's own share | 1 | 1 | 1 |"))
    assert splice(edited)[edited] != edited.read_text()


def test_the_block_lies_within_readmes_first_lines():
    lines = README.splitlines()
    assert lines.index(stacks.END) < stacks.MAX_LINE and 0 < lines.index(stacks.BEGIN) < lines.index(stacks.END)


def test_every_row_names_the_kept_files_it_comes_from():
    block = stacks.render()
    for s in stacks.STACKS:
        line = next(x for x in block.splitlines() if x.startswith(f"| {s.label} |"))
        assert "](docs/downstream-results/downstream-" in line or "](docs/figures/)" in line, line


def _results_with(tmp_path, env: str, phase: str, client: str, stage: int, ratio: float, residual: float):
    results = tmp_path / "results"
    shutil.copytree(KEPT_RESULTS, results)
    path = results / env / phase / "downstream_clients.json"
    data = json.loads(path.read_text())
    row = next(r for r in data["rows"] if r["client"] == client and r["stage"] == stage)
    row.update(ratio=ratio, residual=residual)
    path.write_text(json.dumps(data))
    return results


@pytest.mark.parametrize("ratio, residual, why", [(2.0, 0.05, "label other"), (1.0, 0.0, "label 1,.* says 2")])
def test_a_measured_ratio_off_a_simple_fraction_or_off_the_rule_is_refused(tmp_path, ratio, residual, why):
    # the run's own check (matches_rule) still says true: the renderer judges the number itself
    results = _results_with(tmp_path, "downstream-tf5.24", "patched", "transformers", 3, ratio, residual)
    with pytest.raises(ValueError, match=f"transformers 5.0-5.24: ZeRO-3 patched measured .*{why}"):
        stacks.render(results=results)


def test_training_runs_of_the_wrong_build_are_refused(tmp_path):
    for phase, other in (("unpatched", "patched"), ("patched", "unpatched")):  # the builds swapped
        shutil.copy(stacks.FIGURES / f"training_effect-{other}.json", tmp_path / f"training_effect-{phase}.json")
    with pytest.raises(ValueError, match="not DeepSpeed 0.19.8 unpatched"):
        stacks.render(figures=tmp_path)


def test_advice_written_for_another_verdict_is_refused(monkeypatch):
    own = stacks.Stack("own share", "nothing to do", "untouched", recipe=ClientKind(kind="own_share"))
    monkeypatch.setattr(stacks, "STACKS", (own, ))
    with pytest.raises(ValueError, match="written for 'untouched', the factors give 'gains from the fix'"):
        stacks.render()
