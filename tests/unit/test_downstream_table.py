"""The downstream table and the marker patch (pure parts of patch_and_test.downstream.run*)."""

from __future__ import annotations

import pytest

from patch_and_test.downstream.run import marker_patch
from patch_and_test.core.errors import BadInput
from patch_and_test.core.templating import block_of, replace_block
from patch_and_test.downstream.table import BEGIN, END, render
from tests.unit.test_downstream_expect import _report, _row


def test_a_backport_without_its_marker_patch_is_refused(manifest):
    # every backport ends with the marker; a series without one would let a version-gated client double-correct
    assert marker_patch(manifest.by_name("v0.19.8")).startswith("0004-Mark-ZeRO-3")
    with pytest.raises(BadInput, match="has no marker patch"):
        marker_patch(manifest.by_name("master"))


def test_replace_block_and_block_of():
    doc = f"intro\n{BEGIN}\nold\n{END}\nrest\n"
    new = replace_block(doc, "| t |", BEGIN, END)
    assert block_of(new, BEGIN, END) == "| t |" and new.startswith("intro\n") and new.endswith(f"{END}\nrest\n")
    with pytest.raises(ValueError):
        replace_block("no block", "x", BEGIN, END)


def test_render_from_reports(tmp_path):
    rep = _report([
        _row(stage=2, ratio=1.0, expected=1.0),
        _row(stage=3),
        _row(client="accelerate", client_version="1.16.0", status="not-applicable", note="why", stage=None)
    ])
    rep.write(tmp_path / "downstream-tf5.25" / "patched" / "downstream_clients.json")
    table = render(tmp_path, "R")
    assert ("| downstream-tf5.25 | transformers 5.25.0 | own share, x sp on ZeRO-3 if deepspeed < 0.20.2 "
            "| 0.19.8 patched, marker | 1.000 (rule 1.0) | 2.000 (rule 2.0) |") in table
    assert "not applicable: why" in table and "`R/downstream-tf5.25/patched/downstream_clients.json`" in table
    assert "(no results)" in render(tmp_path / "none")


def test_keep_copies_json_only_without_machine_paths(tmp_path, capsys):
    import json

    from patch_and_test.downstream.table import keep, main

    env = tmp_path / "src" / "downstream-tf5.25"
    _report([_row()]).write(env / "patched" / "downstream_clients.json")
    (env / "patched" / "downstream_clients.log").write_text("log")
    run = {
        "checks": [{
            "report": str(env / "patched" / "downstream_clients.json"),
            "log": "patched/x.log"
        }],
        "steps": [{
            "detail": "exit 0 (report /some/where/downstream-tf5.25/patched/downstream_clients.json)"
        }]
    }
    (env / "run.json").write_text(json.dumps(run))
    written = keep(tmp_path / "src", tmp_path / "kept")
    assert sorted(p.relative_to(tmp_path / "kept").as_posix() for p in written) == [
        "downstream-tf5.25/patched/downstream_clients.json", "downstream-tf5.25/run.json"
    ]
    kept = json.loads((tmp_path / "kept" / "downstream-tf5.25" / "run.json").read_text())
    assert kept["checks"][0]["report"] == "patched/downstream_clients.json"
    assert kept["steps"][0]["detail"] == "exit 0 (report patched/downstream_clients.json)"
    # zero3-sp downstream keep: the same copy, a line per file; no runs folder: exit 2
    assert main([str(tmp_path / "src"), "--to", str(tmp_path / "kept2")]) == 0
    assert capsys.readouterr().out.count("kept: ") == 2
    assert main([str(tmp_path / "none"), "--to", str(tmp_path / "kept2")]) == 2


def test_verify_bundle_re_renders_the_notice_table(tmp_path):
    from patch_and_test.review import bundle as bundle_mod
    from patch_and_test.downstream.table import render_into

    b = tmp_path / "bundle"
    _report([_row(stage=2, ratio=1.0, expected=1.0), _row(stage=3)
             ]).write(b / "results" / "downstream" / "downstream-tf5.25" / "patched" / "downstream_clients.json")
    notice = b / "downstream-notice.md"
    notice.write_text(render_into(f"# notice\n{BEGIN}\n{END}\n", b))
    assert "2.000 (rule 2.0)" in notice.read_text()
    from patch_and_test.review import github_form
    from patch_and_test.review.pr import write_pages
    from patch_and_test.core.series import load_manifest
    write_pages(b)
    assert github_form.write(b, load_manifest().by_name("master"), None)  # no mirror: a note, no branch
    bundle_mod.write_manifest(b)
    assert bundle_mod.verify(b) == []
    notice.write_text(notice.read_text().replace("2.000 (rule 2.0)", "1.000 (rule 2.0)"))
    bundle_mod.write_manifest(b)  # even with matching hashes, the number must come from the results
    assert any(p.startswith("downstream-notice.md: line") for p in bundle_mod.verify(b))


def test_backport_cover_letters_show_the_kept_downstream_results():
    # The "Using a backport with ..." table in every backport cover letter is the kept results, as rendered.
    from patch_and_test.downstream.table import KEPT_RESULTS, plain_table
    from patch_and_test.core.series import load_manifest

    table = plain_table(KEPT_RESULTS)
    assert "transformers 5.25.0 + proposed" in table
    backports = [s for s in load_manifest().series if s.name != "master"]
    assert backports
    for s in backports:
        letter = (s.directory / s.cover_letter).read_text()
        assert "Using a backport with HF Trainer, accelerate or ArcticTraining" in letter, s.name
        assert table in letter, f"{s.name}: its cover letter's downstream table differs from docs/downstream-results"


def test_the_cover_letters_show_the_core_envs_only(tmp_path):
    from patch_and_test.downstream.table import PACKAGE_ROOT, plain_table
    from patch_and_test.review.docs import ARTIFACTS

    for env, client in (("downstream-tf5.25", "transformers"), ("downstream-trl", "trl")):
        _report([_row(client=client, stage=2, ratio=1.0, expected=1.0),
                 _row(client=client, stage=3)]).write(tmp_path / env / "patched" / "downstream_clients.json")
    assert "trl 5.25.0" in render(tmp_path, "R")  # the docs' table, as downstream_table renders it: every env
    assert "trl" not in plain_table(tmp_path) and "transformers 5.25.0" in plain_table(tmp_path)
    # README carries the per-stack summary (downstream.stacks), not this table; it links the clients' page
    assert BEGIN not in (PACKAGE_ROOT / "README.md").read_text()
    # the docs' tables show every env, trl's and axolotl's too
    documents = [a.path for a in ARTIFACTS if a.name == "downstream table"]
    assert len(documents) == 2 and all("| downstream-trl |" in (PACKAGE_ROOT / d).read_text() for d in documents)


@pytest.mark.parametrize("kind, want", [("uv", ["--python-version", "3.12"]), ("pip", ["--ignore-requires-python"])])
def test_clients_install_past_their_requires_python(monkeypatch, kind, want):
    from patch_and_test.downstream import run as downstream
    from patch_and_test.core import install

    monkeypatch.setattr(install.Installer, "find", classmethod(lambda cls: cls(kind, ("x", ))))
    cmd = downstream._installer_cmd("--no-deps", "axolotl==0.21.0", as_python="3.12")
    assert all(a in cmd for a in want) and cmd[-2:] == ["--no-deps", "axolotl==0.21.0"]
    assert not {"--python-version", "--ignore-requires-python"} & set(downstream._installer_cmd("--no-deps", "a"))
