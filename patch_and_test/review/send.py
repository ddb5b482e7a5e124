"""``zero3-sp send``: the pull request's branch, made on your own DeepSpeed checkout, signed by you, tested there.

    zero3-sp send --deepspeed-src PATH [--as 'Name <email>'] [--out DIR] [--depth quick|full]

For whoever opens the pull request, on an up-to-date DeepSpeed checkout, which is only read (its status and HEAD
are the same bytes after). In a clone of it under --out:

1. the series: patches/master when it applies to the checkout's HEAD, else the newest backport that does,
   without its marker patch (ZERO3_SP_GRADIENTS_SUMMED is for backports, not for the pull request);
2. every commit authored, committed and signed off by you: git's user.name and user.email in the checkout, or
   --as (never the package's placeholder nor an .invalid address), the same commits git am gives, checked
   against git am of the series on the same HEAD;
3. DeepSpeed's own tests: the regression test without the fix and with it, the ALST test with the fix alone,
   and the test files the series can reach, before and after it (docs/affected-tests.md);
4. the pull request's title and body from those runs.

Its last three lines say where the result is:

    repo: <the clone holding the branch, ready to push>
    branch: zero3-sp-grad-scale
    body: <the body file; the title is pr-title.txt beside it>

"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import textwrap
import time
from pathlib import Path

from patch_and_test.core import errors
from patch_and_test.core.errors import Exit, SeriesDoesNotApply
from patch_and_test.core.gitrun import git, git_out
from patch_and_test.core.series import (Manifest, Series, apply_series, commit_patches, differences_from_git_am,
                                        differences_from_patches, ensure_clean, load_manifest, tree_has_fix,
                                        work_tree_root)
from patch_and_test.core.signoff import git_identity, parse_identity, resign
from patch_and_test.core.source import SourceTree, checkout_sparse, clone_shared, from_checkout
from patch_and_test.review.github_form import BRANCH, pr_body
from patch_and_test.review.pr import MAX_LINES, TITLE, body_context, nonblank_lines, render_body
from patch_and_test.upstream.job import AffectedVerdict, run_on_tree
from repro.harness.env import host_environment

# What each exit code means here (a subset of errors.Exit, in send's words): its --help and CONTRIBUTING.md.
EXITS = {
    Exit.OK: "send it: the regression test failed without the fix and passes with it, and no DeepSpeed test regressed",
    Exit.NOT_FIXED: "do not send: the regression test does not pass with the series",
    Exit.ERROR: "error: bad input (no identity, the placeholder or an .invalid address, not a clean checkout, ...) or "
    "a test run that crashed",
    Exit.BUG_NOT_REPRODUCED: "do not send: the regression test did not fail without the fix (no bug shown)",
    Exit.SERIES_DOES_NOT_APPLY: "no series applies to the checkout's HEAD: the failing patch and hunk are printed, "
    "and how to reroll",
    Exit.ALREADY_FIXED: "the checkout already carries the fix: nothing to send",
    Exit.REGRESSION: "do not send: a DeepSpeed test passed before the series and fails after it, on every rerun",
}
OWNED = ".zero3-sp-send"  # in an --out folder send made: a later send may replace it
REROLL = ("on a branch of this checkout, git am -3 {patches}/000[1-9]-*.patch, resolve and git am --continue; then "
          "zero3-sp reroll --repo {src} --branch <that branch> --series master -v {version} "
          "(CONTRIBUTING.md, \"The series\")")


def candidates(manifest: Manifest) -> list[Series]:
    """What may go onto a checkout, in order: patches/master, then every backport, newest first, without its marker
    patch. Pure."""
    master = manifest.by_name("master")
    backports = sorted((s for s in manifest.series if s.name != "master"), key=lambda s: s.min_version, reverse=True)
    return [
        dataclasses.replace(s, patches=tuple(p for p in s.patches if p.role != "marker"))
        for s in [master, *backports]
    ]


def choose(repo: Path, base: str, options: list[Series], scratch: Path) -> Series:
    """The first of ``options`` whose patches all apply to ``base`` (tried in an index of its own, nothing moves);
    SeriesDoesNotApply with the first option's failing patch and hunk, and the others' patches."""
    failures = []
    for option in options:
        try:
            commit_patches(repo, base, [p.path for p in option.patches], scratch / option.name)
            return option
        except SeriesDoesNotApply as err:
            failures.append((option.name, str(err)))
    (name, first), *others = failures
    failing = [f"{n}: {why.split(' does not apply')[0]}" for n, why in others]  # each backport's failing patch
    tail = f"; nor does any backport ({', '.join(failing)})" if others else ""
    raise SeriesDoesNotApply(f"patches/{name}: {first}{tail}")


def checkout_state(root: Path) -> tuple[str, str, str]:
    """What send must leave as it found: the checkout's HEAD, its branch and ``git status``'s bytes."""
    return (git_out(root, "rev-parse", "HEAD"), git(root, "symbolic-ref", "-q", "HEAD", check=False).stdout,
            git_out(root, "--no-optional-locks", "status", "--porcelain=v2", "--branch", "--untracked-files=all"))


def identity_problems(repo: Path, base: str, head: str, who: str) -> list[str]:
    """Every commit of base..head whose author, committer or Signed-off-by is not ``who``."""
    problems = []
    for commit in git_out(repo, "rev-list", "--reverse", f"{base}..{head}").split():
        author, committer, trailers = git_out(
            repo, "show", "-s", "--format=%an <%ae>%x00%cn <%ce>%x00%(trailers:key=Signed-off-by,valueonly)",
            commit).split("\0")
        if author != who or committer != who or who not in trailers.splitlines():
            problems.append(f"{commit[:12]}: author {author}, committer {committer}, signed off by "
                            f"{', '.join(trailers.split()) or 'nobody'}")
    return problems


def decide(verdict: AffectedVerdict) -> tuple[Exit, str]:
    """The exit code of a finished run and why, one line: is the branch fit to send?"""
    if verdict.error is not None:
        return Exit(verdict.error_exit or Exit.ERROR), verdict.error
    suite = verdict.suite
    if suite is None or suite.status == "error":
        return Exit.ERROR, "; ".join(suite.errors if suite else ["DeepSpeed's tests did not run"])
    testing = body_context(verdict, []).testing
    without, fixed = testing.regression_without_fix or {}, testing.regression_with_fix or {}
    if not without.get("failed", 0) + without.get("error", 0):
        return Exit.BUG_NOT_REPRODUCED, f"do not send: {testing.regression} did not fail without the fix ({without})"
    if not fixed.get("passed") or fixed.get("failed", 0) + fixed.get("error", 0):
        return Exit.NOT_FIXED, f"do not send: {testing.regression} does not pass with the series ({fixed})"
    if suite.status == "regression":
        return Exit.REGRESSION, f"do not send: {len(suite.regressions)} DeepSpeed test(s) regressed: " + \
            ", ".join(suite.regressions[:3])
    return Exit.OK, (f"{testing.regression}: failed without the fix, passes with it; "
                     f"{len(suite.files)} affected test files: no regression")


def send(src: Path, who: tuple[str, str], out: Path, depth: str = "quick",
         only: list[str] | None = None) -> tuple[Exit, Path, Path]:
    """Everything but the parsing: (exit code, the clone, the body file). Raises PipelineError before the tests.
    ``only`` narrows DeepSpeed's tests to these files and leaves out the partial runs (for the package's tests)."""
    name, email = who
    root = work_tree_root(src)
    ensure_clean(root)
    if tree_has_fix(root):
        raise errors.AlreadyFixed(f"{root} already carries the fix (__avg_scatter_grads divides by "
                                  "sequence_parallel_size): nothing to send")
    if out == root or root in out.parents:
        raise errors.BadInput(f"--out {out} is inside the checkout {root}, which send must leave as it is")
    before = checkout_state(root)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # empty, or an earlier send's (replaced)
        if not (out / OWNED).is_file():
            raise errors.BadInput(f"--out {out} is not empty and was not made by send: pass another folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / OWNED).write_text("made by zero3-sp send; the next send to this folder replaces it\n")
    clone, scratch = out / "DeepSpeed", out / "scratch"
    head = before[0].strip()
    clone_shared(root, clone)
    dropped = checkout_sparse(clone, head)  # no local commit: the branch holds the series' commits only
    chosen = choose(clone, head, candidates(load_manifest()), scratch / "choose")
    signed = out / "patches" / chosen.name
    resign(chosen.directory, signed, name, email)
    series = dataclasses.replace(chosen, directory=signed,
                                 patches=tuple(dataclasses.replace(p, path=signed / p.file) for p in chosen.patches))
    for stale in set(signed.iterdir()) - {p.path for p in series.patches}:
        stale.unlink()  # the cover letter (it names the marker) and the marker patch: not the pull request's
    print(
        f"series {series.name} v{series.version} on {head[:12]}: {len(series.patches)} patches, signed by {name} "
        f"<{email}>; {len(dropped)} paths without blobs left out of the work tree", flush=True)
    # One committer date for every commit made: the commits the tests run on are the branch's, id for id.
    env = {"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": f"{int(time.time())} +0000"}
    commits = commit_patches(clone, head, [p.path for p in series.patches], scratch / "branch", env)
    git_out(clone, "update-ref", f"refs/heads/{BRANCH}", commits[-1])
    problems = (identity_problems(clone, head, BRANCH, f"{name} <{email}>") +
                differences_from_patches(clone, commits, [p.path for p in series.patches]) +
                same_as_git_am(root, series, clone, head, commits))
    if problems:
        raise errors.BadInput(f"the branch is not what it must be: {'; '.join(problems[:3])}")
    print(
        f"{BRANCH}: {len(commits)} commits, each with its patch's diff and the same as git am makes, authored, "
        f"committed and signed off by {name} <{email}>", flush=True)

    def apply(part: Series) -> str:
        made = commit_patches(clone, head, [p.path for p in part.patches], scratch / "apply", env)[-1]
        git_out(clone, "reset", "-q", "--hard", made)
        return made

    tree = SourceTree(path=clone, version=git_out(clone, "show", f"{head}:version.txt").strip(), origin="checkout",
                      upstream_commit=head, base=head, branch=BRANCH, has_tests=(clone / "tests").is_dir(),
                      dropped_paths=dropped)
    verdict = AffectedVerdict(source=root.name, series=series.name, series_version=series.version,
                              only=list(only or []), environment=host_environment("gloo"))
    try:
        run_on_tree(verdict, tree, series, out / "results", roles=series, apply=apply, depth=depth, only=only)
    except errors.PipelineError as err:
        verdict.error, verdict.error_exit = str(err), int(err.exit_code)
    verdict.write(out / "results" / "affected.json")
    git_out(clone, "checkout", "-q", BRANCH)
    if verdict.head not in (None, commits[-1]):
        raise errors.BadInput(f"the tests ran on {verdict.head[:12]}, not on the branch's {commits[-1][:12]}")
    code, why = decide(verdict)
    body = render_body(body_context(verdict, [f"{name} <{email}>"]))
    if nonblank_lines(body) > MAX_LINES:
        raise errors.BadInput(f"the body has {nonblank_lines(body)} non-blank lines (at most {MAX_LINES})")
    (out / "pr-title.txt").write_text(TITLE + "\n")
    (out / "pr-body.md").write_text(pr_body(body))
    shutil.rmtree(scratch, ignore_errors=True)
    if checkout_state(root) != before:
        raise errors.BadInput(f"{root} changed while send ran (HEAD, branch or status): check it")
    print(f"{'ok' if code == Exit.OK else 'error'}: {why}", file=sys.stdout if code == Exit.OK else sys.stderr,
          flush=True)
    return code, clone, out / "pr-body.md"


def same_as_git_am(root: Path, series: Series, clone: Path, base: str, commits: list[str]) -> list[str]:
    """``commits`` against ``git am`` of ``series`` on ``base`` in a working copy of the checkout (the package's
    usual one, with its local drop commit where blobs are missing): the problems, one line each."""
    tree = from_checkout(root, series_name=f"send-{series.name}")
    try:
        am = apply_series(tree.path, series)
        git_out(tree.path, "fetch", "-q", str(clone), f"{BRANCH}:refs/zero3-sp-send/{BRANCH}")
        theirs = git_out(tree.path, "rev-list", "--reverse", f"{am.base}..{am.head}").split()
        return differences_from_git_am(tree.path, base, commits, am.base, theirs, tree.dropped_paths)
    finally:
        git(tree.path, "update-ref", "-d", f"refs/zero3-sp-send/{BRANCH}", check=False)
        tree.release()


def main(argv: list[str] | None = None) -> int:
    codes = "".join(
        textwrap.fill(why, 116, initial_indent=f"  {int(code):<3}", subsequent_indent=" " * 5) + "\n"
        for code, why in sorted(EXITS.items()))
    parser = errors.CommandParser(prog="zero3-sp send", description=f"{__doc__}\nexit codes:\n{codes}",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deepspeed-src", type=Path, required=True, metavar="PATH",
                        help="your up-to-date DeepSpeed checkout, clean (only read)")
    parser.add_argument("--as", dest="identity", metavar="'NAME <EMAIL>'",
                        help="author and sign off as this identity (default: git's user.name and user.email there)")
    parser.add_argument(
        "--out", type=Path, default=Path("zero3-sp-send"),
        help="where the clone, the body and the test results go (default ./%(default)s; "
        "a folder an earlier send made is replaced)")
    parser.add_argument(
        "--depth", choices=("quick", "full"), default="quick",
        help="quick: the affected tests that start no ranks plus the classes the fix changes; "
        "full: every affected test (hours on CPU) (default quick)")
    args = parser.parse_args(argv)
    try:  # the identity first: nothing is read, cloned or run for a sender who cannot sign
        if not args.deepspeed_src.is_dir():
            raise errors.NotACheckout(f"{args.deepspeed_src} is not a directory")
        who = parse_identity(args.identity) if args.identity else git_identity(args.deepspeed_src)
        code, repo, body = send(args.deepspeed_src, who, args.out.resolve(), args.depth)
    except errors.PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        if isinstance(err, SeriesDoesNotApply):
            master = load_manifest().by_name("master")
            print(
                "reroll: " +
                REROLL.format(patches=master.directory, src=args.deepspeed_src, version=master.version + 1),
                file=sys.stderr)
        return int(err.exit_code)
    print(f"push with: git -C {repo} push <your fork> {BRANCH}; title: {repo.parent / 'pr-title.txt'}")
    print(f"repo: {repo}\nbranch: {BRANCH}\nbody: {body}", flush=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
