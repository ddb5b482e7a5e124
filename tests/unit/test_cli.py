import pytest

from repro.harness.cli import UsageError, build_parser, validate


def _parse(*argv):
    return validate(build_parser("t").parse_args(list(argv)))


def test_defaults(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    args = _parse("--backend", "gloo")
    assert (args.world_size, args.sp, args.dp, args.expect, args.timeout) == (2, 2, 1, "fixed", 300.0)


@pytest.mark.parametrize("argv,msg", [
    (("--world-size", "3", "--sp", "2"), "not divisible"),
    (("--sp", "0"), "--sp must be >= 1"),
    (("--world-size", "0"), "--world-size must be >= 1"),
    (("--timeout", "0"), "--timeout"),
])
def test_bad_topology_flags(monkeypatch, argv, msg):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(UsageError, match=msg):
        _parse("--backend", "gloo", *argv)


def test_torchrun_world_size_wins(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert _parse("--backend", "gloo", "--sp", "4").world_size == 4


@pytest.mark.parametrize("flag", [["--local_rank=1"], ["--local-rank", "3"]])
def test_deepspeed_launcher_local_rank_flag_is_accepted(monkeypatch, flag):
    monkeypatch.delenv("RANK", raising=False)
    # Accepted and dropped: LOCAL_RANK carries it; it is neither a common field nor a script flag.
    assert _parse("--backend", "gloo", *flag) == _parse("--backend", "gloo")
    with pytest.raises(SystemExit):  # the parser does refuse a flag it does not know
        _parse("--backend", "gloo", "--local_rnk=1")


def test_script_flags_land_in_extra(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    parser = build_parser("t")
    parser.add_argument("--reduce-bucket-size", type=int, default=16)
    assert validate(parser.parse_args(["--backend", "gloo"])).extra == {"reduce_bucket_size": 16}
