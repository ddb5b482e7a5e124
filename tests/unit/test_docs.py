"""``zero3-sp docs``: one registry of every generated block and file; --check changes nothing and names the stale."""

from __future__ import annotations

import json

import pytest

from patch_and_test.review import docs
from patch_and_test.review.docs import Artifact, block

BEGIN, END = "<!-- t:begin (rendered by zero3-sp docs) -->", "<!-- t:end -->"
OTHER = "<!-- u:begin (rendered by zero3-sp docs) -->", "<!-- u:end -->"
KNOWN_FAILING: list[str] = []  # every kept result names a series version that series.toml has


def test_the_repository_is_current(capsys):
    assert docs.refresh(docs.ARTIFACTS, docs.PACKAGE_ROOT) == ([], [])
    assert docs.problems(docs.PACKAGE_ROOT) == KNOWN_FAILING
    assert docs.main(["--check"]) == (1 if KNOWN_FAILING else 0)
    out = capsys.readouterr().out
    assert "stale" not in out.replace("0 stale", "") and "failing:" not in out


def test_each_artifact_names_a_path_of_the_checkout():
    assert {a.name
            for a in docs.ARTIFACTS} == {
                "stack table", "exit codes", "downstream table", "downstream census", "affected tests", "releases",
                "schemas"
            }
    assert all((docs.PACKAGE_ROOT / a.path).exists() for a in docs.ARTIFACTS)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "doc.md").write_text(f"intro\n{BEGIN}\nold\n{END}\nmiddle\n{OTHER[0]}\nold\n{OTHER[1]}\nend\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gone.txt").write_text("orphan\n")
    return tmp_path


ARTIFACTS = (
    Artifact("t", "doc.md", block(BEGIN, END, lambda: "| t |")),
    Artifact("u", "doc.md", block(*OTHER, lambda: "| u |")),
    Artifact("files", "out", lambda path: {
        path / "a.txt": "a\n",
        path / "gone.txt": None
    }),
)


def test_check_writes_nothing_and_names_each_stale_file(tree):
    before = {p: p.read_text() for p in tree.rglob("*") if p.is_file()}
    assert docs.refresh(ARTIFACTS, tree) == (["t: doc.md", "u: doc.md", "files: out/a.txt", "files: out/gone.txt"], [])
    assert {p: p.read_text() for p in tree.rglob("*") if p.is_file()} == before


def test_write_renders_every_block_of_a_document_and_removes_what_is_no_longer_rendered(tree):
    assert len(docs.refresh(ARTIFACTS, tree, write=True)[0]) == 4
    assert (tree /
            "doc.md").read_text() == f"intro\n{BEGIN}\n| t |\n{END}\nmiddle\n{OTHER[0]}\n| u |\n{OTHER[1]}\nend\n"
    assert (tree / "out" / "a.txt").read_text() == "a\n" and not (tree / "out" / "gone.txt").exists()
    assert docs.refresh(ARTIFACTS, tree) == ([], [])


def test_a_kept_text_the_artifact_counts_as_rendered_is_current_until_written(tree):
    loose = Artifact("loose", "doc.md", lambda path: {path: path.read_text().upper()}, same=lambda k, r: True)
    assert docs.refresh((loose, ), tree) == ([], [])
    assert docs.refresh((loose, ), tree, write=True) == (["loose: doc.md"], [])  # write renders it exactly
    assert (tree / "doc.md").read_text().startswith("INTRO")


def test_an_artifact_that_cannot_be_rendered_is_named_and_the_others_still_are(tree):
    (tree / "doc.md").write_text("no markers\n")
    stale, errors = docs.refresh(ARTIFACTS, tree)
    assert stale == ["files: out/a.txt", "files: out/gone.txt"]
    assert errors == [
        "t: doc.md: the document has no t block (its marker lines)",
        "u: doc.md: the document has no u block (its marker lines)"
    ]


@pytest.mark.parametrize("check", [True, False])
def test_exit_codes(tree, monkeypatch, capsys, check):
    monkeypatch.setattr(docs, "PACKAGE_ROOT", tree)
    monkeypatch.setattr(docs, "ARTIFACTS", ARTIFACTS)
    monkeypatch.setattr(docs, "problems", lambda root: [])
    argv = ["--check"] if check else []
    assert docs.main(argv) == (1 if check else 0)
    assert f"{'stale' if check else 'updated'}: t: doc.md" in capsys.readouterr().out
    assert docs.main(argv) == (1 if check else 0)  # --check wrote nothing; the write made it current
    monkeypatch.setattr(docs, "problems", lambda root: ["a failing row"])
    assert docs.main([]) == 1 and "failing: a failing row" in capsys.readouterr().out
    (tree / "doc.md").write_text("no markers\n")
    assert docs.main(argv) == 2 and "error: t: doc.md: the document has no t block" in capsys.readouterr().err


def _kept(root, rel, data):
    path = root / "docs" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_a_kept_result_that_names_a_series_or_version_gone_fails(tmp_path, manifest):
    master = manifest.by_name("master")
    _kept(tmp_path, "a/affected.json", {"series": "master"})  # which version ran is not recorded
    _kept(tmp_path, "c/affected.json", {"series": "master", "series_version": master.version - 1})
    _kept(tmp_path, "d/affected.json", {"series": "master", "series_version": master.version})
    _kept(tmp_path, "e/run.json", {"series": "master"})  # a downstream run records the name only
    _kept(tmp_path, "b/affected.json", {"series": "v0.14.0-v0.17.1"})
    _kept(tmp_path, "s/verdict.json", {"series": {"name": "master", "version": master.version - 1}})
    _kept(tmp_path, "r/releases.json", {"series": [{"name": "master", "version": master.version}]})
    _kept(tmp_path, "schemas/x.schema.json", {"properties": {"series": {}}})
    _kept(tmp_path, "list.json", [1, 2])
    assert docs.kept_series(tmp_path / "docs", manifest) == [
        "docs/a/affected.json: series master with no series_version (which version ran is not recorded)",
        "docs/b/affected.json: series v0.14.0-v0.17.1 is not in patches/series.toml",
        f"docs/c/affected.json: series master v{master.version - 1}; patches/series.toml has v{master.version}",
        f"docs/s/verdict.json: series master v{master.version - 1}; patches/series.toml has v{master.version}",
    ]
