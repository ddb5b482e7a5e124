"""``zero3-sp`` (``python -m patch_and_test``): one command per thing a person does, each its module's main."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

from patch_and_test import cli
from tests.conftest import ROOT


def front_door(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "patch_and_test", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_no_command_prints_the_commands_and_exits_2():
    done = front_door()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: zero3-sp COMMAND")
    assert all(f"\n  {name} " in done.stderr for name in cli.COMMANDS)


def test_help_lists_every_command_on_one_line(capsys):
    assert cli.main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[1].strip() for line in lines if line.startswith("  ")] == list(cli.COMMANDS)


@pytest.mark.parametrize("argv, shown", [(["nothing"], "'nothing'"), (["affected"], None),
                                         (["affected", "nothing"], "'affected nothing'")])
def test_an_unknown_command_is_exit_2(argv, shown, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert (f"error: zero3-sp: no command {shown}" in err) if shown else "error" not in err
    if argv[0] == "affected":  # a group lists its own commands only
        assert err.startswith("usage: zero3-sp affected COMMAND") and "  affected select " in err
        assert "doctor" not in err


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_is_its_modules_main_with_its_own_help(name, capsys):
    assert callable(importlib.import_module(cli.COMMANDS[name][0]).main)
    with pytest.raises(SystemExit) as done:
        cli.main([*name.split(), "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: zero3-sp {name} ")


def test_installed_without_a_checkout_only_the_users_commands_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "DATA_ROOT", tmp_path)  # a wheel's own copy of patches/, not the checkout's
    assert cli.main(["docs", "--check"]) == 2
    assert "error: zero3-sp docs runs in a checkout of zero3-sp-gradfix" in capsys.readouterr().err
    for name in cli.ANYWHERE:
        with pytest.raises(SystemExit) as done:
            cli.main([*name.split(), "--help"])
        assert done.value.code == 0


def test_the_doctor_imports_none_of_the_other_commands():
    code = ("import sys\nfrom patch_and_test import cli\ntry:\n    cli.main(['doctor', '--help'])\n"
            "except SystemExit:\n    pass\nprint(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    loaded = done.stdout.splitlines()[-1].split()
    assert "patch_and_test.doctor.cli" in loaded, done.stderr
    others = [
        m for m in loaded if m.startswith(("patch_and_test.review", "patch_and_test.job", "patch_and_test.tools",
                                           "patch_and_test.upstream", "jinja2"))
    ]
    assert others == []


# Run the front door with the maintainers' and the tests' packages made unimportable: what a user's install lacks.
WITHOUT_MAINT = """import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in {"jinja2", "tox", "nox", "pytest"}:
            raise ImportError(f"{name} is not installed for a user")
sys.meta_path.insert(0, Refuse())
from patch_and_test.cli import main
sys.exit(main(sys.argv[1:]))
"""


def doctor_without_maint(config: dict, tmp_path, **run) -> subprocess.CompletedProcess:
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    argv = ["doctor", "--ds-config", str(tmp_path / "ds_config.json"), "--sp", "2", "--recipe", "none"]
    return subprocess.run([sys.executable, "-c", WITHOUT_MAINT, *argv], capture_output=True, text=True, timeout=120,
                          **{
                              "cwd": ROOT,
                              **run
                          })


@pytest.mark.parametrize("stage, code", [(3, 1), (1, 0)])
def test_the_doctor_runs_without_the_maintainers_packages(tmp_path, stage, code):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("the doctor reads the installed DeepSpeed; none here")
    done = doctor_without_maint({"zero_optimization": {"stage": stage}}, tmp_path)
    assert done.returncode == code, done.stderr
    assert "verdict: " in done.stdout and ("remedy: DeepSpeed" in done.stdout) == (code == 1)
