"""The parity audit's command line (repro/parity_audit.py -> repro.audit.run): flags parsed once,
topologies chosen from them, the ranks' argv built from them. Nothing is launched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from repro.audit import run
from repro.audit.space import SP_VALUES
from repro.harness import exit_codes, launch
from repro.harness.cli import build_parser
from tests.conftest import FIXTURES

# Written by the audit before it became repro/audit/ (world 2, sp 2, --expect buggy: holds).
OLD_REPORT = FIXTURES / "parity-audit" / "old-code-sp2dp1-buggy.json"

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", launch.CHILD_DIR_VAR)


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    """A plain local invocation, whatever launched pytest."""
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)


def _launches(out: str) -> list[str]:
    return [line.split(", ")[1].split(":")[0] for line in out.splitlines() if line.startswith("# world ")]


def test_cli_lists_points_without_running(capsys):
    assert run.main(["--list", "--world-size", "2", "--sp", "2"]) == 0
    out = capsys.readouterr().out
    assert "# world 2, sp2dp1:" in out and "z3.rs1.cg1.fits/sp2dp1/fp32/gas1/pdf=1/postscale" in out
    assert "sp1dp2" not in out
    assert run.main(["--list", "--mode", "full"]) == 0
    assert "# 2800 points in 5 launches (full)" in capsys.readouterr().out


def test_cli_world_size_alone_keeps_every_sp(capsys):
    assert run.main(["--list", "--world-size", "4"]) == 0
    assert _launches(capsys.readouterr().out) == ["sp2dp2", "sp4dp1"]


def test_cli_sp_alone_keeps_every_world_size(capsys):
    # --sp without --world-size: every topology with that sp. The old entry parsed argv twice, the
    # second time against the shared contract with its default world size 2: "world size 2 is not
    # divisible by --sp 4", exit 2.
    assert run.main(["--list", "--sp", "4"]) == 0
    assert _launches(capsys.readouterr().out) == ["sp4dp1"]
    assert run.main(["--list", "--sp", "2"]) == 0
    assert _launches(capsys.readouterr().out) == ["sp2dp1", "sp2dp2"]


def test_an_abbreviated_flag_counts_as_given(capsys):
    # argparse accepts --world for --world-size (and --s=4 is ambiguous, --sp is whole): one parse
    # decides what was given, abbreviated or not.
    assert run.main(["--world", "4", "--list"]) == 0
    abbreviated = capsys.readouterr().out
    assert run.main(["--world-size", "4", "--list"]) == 0
    assert capsys.readouterr().out == abbreviated
    assert run.main(["--list"]) == 0
    assert capsys.readouterr().out != abbreviated
    assert run.main(["--wor", "2", "--sp", "1", "--mo", "full", "--stag", "0", "--list"]) == 0
    assert _launches(capsys.readouterr().out) == ["sp1dp2"]


def test_argv_defaults_to_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["parity_audit.py", "--world", "1", "--list"])
    assert run.main() == 0
    assert _launches(capsys.readouterr().out) == ["sp1dp1"]


def test_cli_rejects_topologies_outside_the_space(capsys):
    assert run.main(["--list", "--world-size", "3", "--sp", "3"]) == 2
    assert run.main(["--list", "--world-size", "8", "--sp", "4"]) == 2
    assert run.main(["--list", "--sp", "3"]) == 2
    assert run.main(["--list", "--world-size", "4", "--sp", "3"]) == 2  # the shared contract's check
    assert run.main(["--list", "--point", "nothing*"]) == 0
    assert 3 not in SP_VALUES


def test_the_ranks_run_the_entry_script_with_the_parsed_flags(monkeypatch):
    """Each launch's ranks get this topology's flags, spelled out from the one parse (the flags
    given abbreviated here, a value with a space kept whole), and run repro/parity_audit.py; this
    process's sys.argv is left alone."""
    seen = []

    def fake_run(args, program, sink, rank_argv=None):
        seen.append((list(rank_argv), args))
        return exit_codes.SKIPPED

    monkeypatch.setattr(run.launch, "run", fake_run)
    before = list(sys.argv)
    code = run.main([
        "--world", "4", "--bac", "gloo", "--exp", "buggy", "--stag", "3", "--dty", "bf16", "--keep", "--no-k",
        "--timeout", "500", "--known", "/no such/known.toml"
    ])
    assert code == exit_codes.SKIPPED and sys.argv == before
    assert [a.sp for _, a in seen] == [2, 4] and all(a.world_size == 4 and a.backend == "gloo" for _, a in seen)
    argv, _ = seen[0]
    assert argv[0] == str(run.ENTRY_SCRIPT) and run.ENTRY_SCRIPT.is_file()
    flags = argv[1:]
    assert flags[:8] == ["--world-size", "4", "--sp", "2", "--backend", "gloo", "--expect", "buggy"]
    for expected in (["--no-known"], ["--mode", "quick"], ["--stage", "3"], ["--dtype", "bf16"], ["--keep-logs"]):
        assert any(flags[i:i + len(expected)] == expected for i in range(len(flags))), expected
    assert float(flags[flags.index("--timeout") + 1]) <= 500
    assert flags[flags.index("--known") + 1] == "/no such/known.toml"  # --no-known: never read


def test_cli_rejudges_a_json(tmp_path, capsys):
    assert run.main(["--from-json", str(OLD_REPORT), "--expect", "buggy"]) == 0
    # without the known list the predivide-equals-world points are unexplained
    assert run.main(["--from-json", str(OLD_REPORT), "--expect", "buggy", "--no-known"]) == 1
    assert run.main(["--from-json", str(OLD_REPORT), "--expect", "fixed", "--table", "none"]) == 1
    assert "--expect fixed: DOES NOT HOLD" in capsys.readouterr().out
    written = tmp_path / "again.json"
    assert run.main(["--from-json", str(OLD_REPORT), "--exp", "buggy", "--table", "none", "--json", str(written)]) == 0
    assert written.is_file()
    assert run.main(["--from-json", str(tmp_path / "missing.json")]) == 2


def _args(argv: list[str]):
    parser = build_parser("", prog="parity_audit.py", expect_help=run.EXPECT_HELP)
    run._add_arguments(parser)
    return run._repro_args(parser.parse_args(argv))


def test_selection_flags_round_trip():
    """Each selection flag lands in its own dest and the child's argv spells it back."""
    flags = [
        "--mode", "full", "--stage", "3", "--stage", "0", "--dtype", "bf16", "--gas", "2", "--point", "z3*", "--point",
        "a b*"
    ]
    args = _args(flags)
    assert [args.extra[f] for f in ("mode", *run.FILTERS)] == ["full", [3, 0], ["bf16"], [2], ["z3*", "a b*"]]
    assert run._selection_argv(args) == flags and run._selection_argv(_args(run._selection_argv(args))) == flags
    assert run._selection_argv(_args([])) == ["--mode", "quick"]


def test_the_script_runs_as_documented():
    """``python repro/parity_audit.py ...`` from any folder: the thin entry finds the package."""
    done = subprocess.run([sys.executable, str(run.ENTRY_SCRIPT), "--world-size", "1", "--list"], cwd="/",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "# 4 points in 1 launches (quick)"
