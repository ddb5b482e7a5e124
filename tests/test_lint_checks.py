"""The lint module's own checks, on snippets and on the real patch files (fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patch_and_test.core import errors
from patch_and_test.tools import lint
from patch_and_test.core.signoff import check_signoff
from patch_and_test.core.series import touched_files

HEADER = "# Copyright (c) Microsoft Corporation.\n# SPDX-License-Identifier: Apache-2.0\n\n# DeepSpeed Team\n"


def checks(rel: str, text: str, tree: Path | None = None) -> list[str]:
    return [f.check for f in lint.check_text(rel, text, tree)]


def test_clean_file_has_no_finding():
    assert checks("deepspeed/x.py", HEADER + "import deepspeed.comm as dist\nimport torch.distributed.nn\n") == []


@pytest.mark.parametrize(
    "line,check",
    [
        ("import torch.distributed as dist", "check-torchdist"),
        ("torch.distributed.all_reduce(t)", "check-torchdist"),
        ("x = torch.cuda.current_device()", "check-torchcuda"),
        ("t = t.cuda()", "check-torchcuda"),
        ("ok = t.is_cuda", "check-torchcuda"),
        ("x = 1   ", "trailing-whitespace"),
    ],
)
def test_forbidden_lines(line, check):
    assert checks("deepspeed/x.py", HEADER + line + "\n") == [check]


def test_allowed_lines():
    assert checks("deepspeed/x.py", HEADER + "x = torch.cuda.current_device()  #ignore-cuda\n") == []
    assert checks("deepspeed/x.py", HEADER + "from torch.distributed.nn import functional\n") == []


def test_file_endings_and_header():
    assert checks("deepspeed/x.py", HEADER + "x = 1") == ["end-of-file-fixer"]
    assert checks("deepspeed/x.py", HEADER + "x = 1\n\n") == ["end-of-file-fixer"]
    assert "mixed-line-ending" in checks("deepspeed/x.py", HEADER + "x = 1\r\n")
    assert checks("deepspeed/x.py", "x = 1\n") == ["check-license", "check-license"]
    assert checks("docs/x.md", "no header needed\n") == []


def test_hook_excludes_come_from_the_tree(tmp_path):
    (tmp_path / ".pre-commit-config.yaml").write_text("""repos:
-   repo: local
    hooks:
    -   id: check-torchdist
        name: check-torchdist
        entry: ./scripts/check-torchdist.py
        language: python
        exclude: ^(deepspeed/comm/|docs/)
""")
    assert checks("deepspeed/comm/torch.py", HEADER + "import torch.distributed as dist\n", tmp_path) == []
    assert checks("deepspeed/x.py", HEADER + "import torch.distributed as dist\n", tmp_path) == ["check-torchdist"]


def test_real_patches_are_signed_off_by_their_author(manifest):
    for series in manifest.series:
        assert lint.check_cover(series) == []
        for patch in series.patches:
            assert check_signoff(patch.path) == [], patch.path


def test_signoff_mismatch_and_absence(manifest, tmp_path):
    real = manifest.series[0].patches[0].path.read_text()
    other = tmp_path / "other.patch"
    other.write_text(real.replace("Signed-off-by: ", "Signed-off-by: Someone Else <else@example.com>\nX-Was: ", 1))
    assert [why for why in check_signoff(other) if "does not match the author" in why]
    none = tmp_path / "none.patch"
    none.write_text("\n".join(line for line in real.splitlines() if not line.startswith("Signed-off-by:")) + "\n")
    assert "not signed off" in check_signoff(none)[0]


def test_touched_files(manifest):
    by_name = {s.name: touched_files(*(p.path for p in s.patches)) for s in manifest.series}
    companion = [
        "docs/_tutorials/ulysses-alst-sequence-parallelism.md", "tests/unit/ulysses_alst/test_ulysses_sp_hf.py"
    ]
    autoep = "tests/unit/v1/moe/test_autoep_unit.py"  # from v0.19.3 the fix keeps that unit test green
    # every series carries the pull request's form: the divisor of reduce_scatter_coalesced and its test
    coalesced = [
        "deepspeed/runtime/comm/coalesced_collectives.py", "deepspeed/runtime/zero/stage3.py",
        "tests/unit/runtime/comm/test_coalesced_collectives.py"
    ]
    for name in ("master", "v0.19.8", "v0.19.3-v0.19.7"):
        assert by_name[name] == [*coalesced, autoep, "tests/unit/v1/zero/test_zero.py", *companion], name
    for name in ("v0.19.0-v0.19.2", "v0.18.4-v0.18.9", "v0.17.6-v0.18.3"):
        assert by_name[name] == [*coalesced, "tests/unit/v1/zero/test_zero.py", *companion], name
    assert by_name["v0.17.2-v0.17.5"] == [
        *coalesced, "tests/unit/runtime/zero/test_zero.py", "tests/unit/ulysses_alst/test_ulysses_sp_hf.py"
    ]
    for name in ("v0.16.2-v0.17.1", "v0.14.0-v0.16.1"):
        assert by_name[name] == [*coalesced, "tests/unit/runtime/zero/test_zero.py"], name


def _have_tools() -> bool:
    try:
        for name in lint.TOOLS:
            lint._tool(name)
    except errors.BadInput:
        return False
    return True


@pytest.mark.git_tools
def test_tools_find_format_import_and_spelling_problems(tmp_path):
    if not _have_tools():
        pytest.skip(f"{' '.join(f'{t}=={v}' for t, v in lint.TOOLS.items())} are not installed here")
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "bad.py").write_text(HEADER + "import os\nx = [1,2]\n# recieve\n")
    found = {f.check for f in lint.run_tools(tmp_path, ["deepspeed/bad.py"])}
    assert found == {"yapf", "flake8", "codespell"}
    (tmp_path / "deepspeed" / "good.py").write_text(HEADER + "import os\n\nprint(os.sep)\n")
    assert lint.run_tools(tmp_path, ["deepspeed/good.py"]) == []


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as done:
        lint.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "pinned: " + " ".join(f"{t}=={v}" for t, v in lint.TOOLS.items()) in out
