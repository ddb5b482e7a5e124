"""``zero3-sp run``: the whole job for one DeepSpeed source, one backend.

Get DeepSpeed (the newest supported PyPI release by default, pinned by sha256 in
deepspeed-sdists.lock; or your checkout via DEEPSPEED_SRC, never modified), apply the series
the manifest picks to a copy of it (a series that does not apply ends the run before any
build), install the unpatched base and show the bug with both reproducers, install the patched
build (it stays installed here), show the bug gone (reproducers, the twin of the upstream
regression test, the parity audit, and DeepSpeed's own tests where the source has them), and
write results/<env>/verdict.json.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from patch_and_test.core.errors import CommandParser, Exit, exit_codes_help, positive_seconds
from patch_and_test.job.pipeline import PipelineConfig, run

EXIT_HELP = exit_codes_help() + """\
environment:
  DEEPSPEED_SRC       a DeepSpeed git checkout to use instead of PyPI (it is cloned, not modified)
  DEEPSPEED_VERSION   the PyPI release to use (default: the newest supported)
  DEEPSPEED_MIRROR    a git clone of DeepSpeed with its history (--newest-upstream, the tests' mirror)
  ZERO3_SP_BACKEND    gloo (default) or nccl
  ZERO3_SP_CACHE      where sdists, source trees, wheels and built ops are cached
  ZERO3_SP_UPSTREAM_DEPTH  quick (default) or full: which of the affected DeepSpeed tests run
"""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="zero3-sp run", description=__doc__, epilog=EXIT_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=os.environ.get("DEEPSPEED_VERSION") or None,
                        help="DeepSpeed release from PyPI (env DEEPSPEED_VERSION)")
    parser.add_argument("--src", type=Path, default=os.environ.get("DEEPSPEED_SRC") or None,
                        help="DeepSpeed checkout to use instead of PyPI (env DEEPSPEED_SRC)")
    parser.add_argument(
        "--newest-upstream", action="store_true",
        help="the newest DeepSpeed code: the newest locked sdist grafted onto the mirror's master "
        "(its tests/ and docs/), patched with the pull-request series; needs the mirror "
        "(DEEPSPEED_MIRROR); see docs/newest-upstream.md")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=os.environ.get("ZERO3_SP_BACKEND", "gloo"),
                        help="gloo: CPU ranks; nccl: one GPU per rank (default: env ZERO3_SP_BACKEND, else gloo)")
    parser.add_argument(
        "--env-name", default=os.environ.get("TOX_ENV_NAME") or os.environ.get("NOX_SESSION_NAME") or "patch-and-test",
        help="names the results folder (default: the tox/nox env)")
    parser.add_argument("--results", type=Path, default=None, help="default: results/<env-name>")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0,
                        help="deadline per reproducer launch, s (default %(default)s; the parity audit gets 3x)")
    parser.add_argument("--no-upstream-suites", dest="upstream_suites", action="store_false",
                        help="with a checkout: skip DeepSpeed's own tests that the series can reach, before/after")
    parser.add_argument(
        "--upstream-depth", choices=["quick", "full"], default=os.environ.get("ZERO3_SP_UPSTREAM_DEPTH") or "quick",
        help="quick: the affected tests that start no ranks, the regression test and the ALST test; "
        "full: every affected test (hours on 2 cores); env ZERO3_SP_UPSTREAM_DEPTH")
    parser.add_argument("--upstream-workers", type=int, default=0,
                        help="run the affected DeepSpeed tests with pytest-xdist -n N (default: one process)")
    parser.add_argument("--no-audit", dest="audit", action="store_false",
                        help="skip the parity audit (repro/parity_audit.py, quick mode) before and after")
    return parser


def results_dir(args: argparse.Namespace) -> Path:
    # Absolute: DeepSpeed's own tests run with the source tree as working directory.
    return (args.results or Path("results") / args.env_name).resolve()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if sum([args.src is not None, args.version is not None, args.newest_upstream]) > 1:
        print("error: give one of DEEPSPEED_SRC, DEEPSPEED_VERSION and --newest-upstream", file=sys.stderr)
        return int(Exit.ERROR)
    results = results_dir(args)
    # The parser's destinations are PipelineConfig's fields.
    verdict = run(PipelineConfig(**{**vars(args), "results": results}))
    if verdict.error:
        # "skipped: " for exit 77, as the reproducers print it; tox's toxfile.py shows it as SKIP.
        label = "skipped" if verdict.exit_code == Exit.SKIPPED else "error"
        print(f"{label}: {verdict.error}", file=sys.stderr)
    print(f"verdict: {results / 'verdict.json'}")
    return verdict.exit_code
