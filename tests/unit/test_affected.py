"""The affected-test rule on synthetic diffs and synthetic trees (no DeepSpeed needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from patch_and_test.upstream import affected

STAGE = textwrap.dedent("""\
    import os


    class Optimizer3(object):

        def __init__(self):
            self.world = 2

        def __avg_grads(self, grads, group):
            world = self.world
            scale = world / 1.0
            return [g * scale for g in grads]

        def other(self):
            return 1
    """)

# Changes line 11 ("scale = world / 1.0") inside __avg_grads: reads a new attribute.
PATCH = textwrap.dedent("""\
    From 1 Mon Sep 17 00:00:00 2001
    Subject: [PATCH 1/2] fix

    ---
    diff --git a/pkg/stage.py b/pkg/stage.py
    index 1..2 100644
    --- a/pkg/stage.py
    +++ b/pkg/stage.py
    @@ -10,3 +10,3 @@ class Optimizer3(object):
             world = self.world
    -        scale = world / 1.0
    +        scale = world / float(self.seq_parallel_size)  # "a string" self.not_read
             return [g * scale for g in grads]
    --
    2.39.5
    """)

TEST_PATCH = textwrap.dedent("""\
    diff --git a/tests/unit/test_new.py b/tests/unit/test_new.py
    new file mode 100644
    --- /dev/null
    +++ b/tests/unit/test_new.py
    @@ -0,0 +1,2 @@
    +def test_x():
    +    pass
    """)


def make_tree(tmp_path: Path, tests: dict[str, str], helpers: dict[str, str] | None = None) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "stage.py").write_text(STAGE)
    for rel, text in {**tests, **(helpers or {})}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_parse_patch_numbers_the_changed_lines():
    (change, ) = affected.parse_patch(PATCH, "0001-fix.patch")
    assert change.path == "pkg/stage.py" and change.patch == "0001-fix.patch"
    (hunk, ) = change.hunks
    assert hunk.header == "class Optimizer3(object):"
    assert hunk.removed == ((11, "        scale = world / 1.0"), )
    assert [n for n, _ in hunk.added] == [12]  # inserted before old line 12


def test_parse_patch_new_file_and_several_files():
    changes = affected.parse_patch(PATCH + TEST_PATCH)
    assert [c.path for c in changes] == ["pkg/stage.py", "tests/unit/test_new.py"]
    assert len(changes[1].hunks[0].added) == 2


def test_changed_names_enclosing_chain_reads_and_mangling(tmp_path):
    tree = make_tree(tmp_path, {})
    names = {(n.name, n.kind): n for n in affected.changed_names(affected.parse_patch(PATCH), tree)}
    assert ("Optimizer3", "enclosing") in names and ("__avg_grads", "enclosing") in names
    assert names[("__avg_grads", "enclosing")].also_as == ("_Optimizer3__avg_grads", )
    assert ("seq_parallel_size", "reads") in names
    # Only attributes of self/cls: not locals, builtins or calls, nor strings and comments.
    assert not {"float", "not_read", "string", "world", "scale"} & {n for n, _ in names}
    assert ("other", "enclosing") not in names


def test_enclosing_falls_back_to_the_hunk_header_without_the_file(tmp_path):
    names = affected.changed_names(affected.parse_patch(PATCH), tmp_path)  # no pkg/stage.py here
    assert ("Optimizer3", "enclosing") in {(n.name, n.kind) for n in names}


def test_select_rule(tmp_path):
    tree = make_tree(
        tmp_path, {
            "tests/unit/test_literal.py": "obj._Optimizer3__avg_grads([], None)\n",
            "tests/unit/test_attr.py": "opt.seq_parallel_size = 1\n",
            "tests/unit/test_class.py": "from pkg.stage import Optimizer3\n",
            "tests/unit/test_builtin_only.py": "x = float(1)\n",
            "tests/unit/test_longer_name.py": "seq_parallel_size_total = 3; Optimizer3X = 1\n",
            "tests/unit/test_edited.py": "def test_a():\n    pass\n",
            "tests/unit/helper_mod.py": "Optimizer3\n",
        })
    edit = textwrap.dedent("""\
        diff --git a/tests/unit/test_edited.py b/tests/unit/test_edited.py
        --- a/tests/unit/test_edited.py
        +++ b/tests/unit/test_edited.py
        @@ -1,2 +1,2 @@
         def test_a():
        -    pass
        +    assert True
        """)
    sel = affected.select(
        affected.parse_patch(PATCH, "0001-fix.patch") + affected.parse_patch(edit, "0002-t.patch"), tree)
    reasons = {f.path: f.reasons for f in sel.files}
    assert sorted(reasons) == [
        "tests/unit/test_attr.py", "tests/unit/test_class.py", "tests/unit/test_edited.py",
        "tests/unit/test_literal.py"
    ]
    assert reasons["tests/unit/test_edited.py"] == ("edited by the series (0002-t.patch)", )
    assert any("__avg_grads" in r and "changed" in r for r in reasons["tests/unit/test_literal.py"])
    assert any("seq_parallel_size" in r and "newly read" in r for r in reasons["tests/unit/test_attr.py"])
    assert sel.generic == ()
    assert [h.path for h in sel.helpers] == ["tests/unit/helper_mod.py"]
    assert sel.test_files_scanned == 6
    assert "4 of 6 test files" in sel.describe()


def test_a_name_in_too_many_test_files_is_generic(tmp_path):
    tests = {f"tests/unit/test_{i}.py": ("seq_parallel_size\n" if i < 7 else "pass\n") for i in range(40)}
    sel = affected.select(affected.parse_patch(PATCH), make_tree(tmp_path, tests))
    assert "seq_parallel_size (7 files)" in sel.generic  # 7 of 40 > 10%, and more than 5
    assert not any("seq_parallel_size" in r for f in sel.files for r in f.reasons)


def test_new_test_file_of_the_series_is_selected(tmp_path):
    sel = affected.select(affected.parse_patch(TEST_PATCH, "0002-t.patch"), make_tree(tmp_path, {}))
    assert sel.paths == ["tests/unit/test_new.py"]


def test_docs_and_test_hunks_contribute_no_names(tmp_path):
    doc = textwrap.dedent("""\
        diff --git a/docs/x.md b/docs/x.md
        --- a/docs/x.md
        +++ b/docs/x.md
        @@ -1 +1 @@
        -old
        +Optimizer3 seq_parallel_size
        """)
    assert affected.changed_names(affected.parse_patch(doc + TEST_PATCH), make_tree(tmp_path, {})) == []


def test_series_folder_skips_the_cover_letter(tmp_path):
    (tmp_path / "0000-cover-letter.patch").write_text(TEST_PATCH)
    (tmp_path / "0001-fix.patch").write_text(PATCH)
    assert [c.patch for c in affected.patch_changes(affected.numbered_patches(tmp_path))] == ["0001-fix.patch"]


def test_cli_prints_the_selection(tmp_path, capsys):
    series = tmp_path / "series"
    series.mkdir()
    (series / "0001-fix.patch").write_text(PATCH)
    (tmp_path / "tree").mkdir()
    tree = make_tree(tmp_path / "tree", {"tests/test_a.py": "Optimizer3\n"})
    assert affected.main([str(series), str(tree), "--json", str(tmp_path / "s.json")]) == 0
    assert "tests/test_a.py: names Optimizer3" in capsys.readouterr().out
    assert affected.main([str(series), str(tmp_path / "nowhere")]) == 2


def test_newly_read_means_attributes_of_self_or_cls():
    assert affected._code_names("x = dist.get_world_size(group=self.dp_group) * cls.factor + other.attr") == {
        "dp_group", "factor"
    }
    assert affected._code_names("y = myself.value  # self.comment") == set()


def test_docs_table_is_the_kept_runs_as_rendered():
    # docs/affected-tests.md shows the kept affected-tests runs; every number comes from their files.
    from patch_and_test import PACKAGE_ROOT
    from patch_and_test.core.templating import block_of
    from patch_and_test.review.pr import BEGIN, END, KEPT, affected_table

    runs = sorted(KEPT.glob("*/affected.json"))
    assert runs and any(p.parent.name == "newest-upstream" for p in runs)
    text = block_of((PACKAGE_ROOT / "docs" / "affected-tests.md").read_text(), BEGIN, END)
    assert text == affected_table(), "run zero3-sp docs"
    for path in runs:
        assert f"(affected-results/{path.parent.name}/affected.json)" in text
