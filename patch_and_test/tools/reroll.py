"""``zero3-sp reroll``: a DeepSpeed branch as version N of a series (what b4 would do; series.toml is ours)."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patch_and_test.core import errors
from patch_and_test.core.gitrun import git, git_out
from patch_and_test.core.series import DEFAULT_MANIFEST, MARKER_NAME, STAGE3, email_subject
from patch_and_test.core.source import FIXED_IDENTITY, clone_shared, prepare_working_copy
from repro.harness.files import TOMLDecodeError, load_toml

# Pinned so that a user's git configuration cannot change the patches we write.
FORMAT_CONFIG = ("-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "diff.relative=false", "-c",
                 "diff.algorithm=myers", "-c", "format.signOff=false", "-c", "format.useAutoBase=false", "-c",
                 "format.coverFromDescription=none", "-c", "core.abbrev=12")


@dataclass(frozen=True)
class Reroll:
    series: str
    version: int
    upstream: str
    local_base: str
    head: str
    files: tuple[Path, ...]
    range_diff: str | None  # against the previous version, as written into the cover letter
    change_id: str
    scaffolding: tuple[str, ...]  # commits left out of the series


def _commit(repo: Path, rev: str) -> str:
    result = git(repo, "rev-parse", "-q", "--verify", f"{rev}^{{commit}}", check=False)
    if result.returncode != 0:
        raise errors.BadInput(f"{rev!r} is not a commit in {repo}")
    return result.stdout.strip()


def _touched(repo: Path, commit: str) -> list[tuple[str, str]]:
    out = git_out(repo, "diff-tree", "--no-commit-id", "-r", "--name-status", "--no-renames", commit)
    return [tuple(line.split("\t", 1)) for line in out.splitlines() if line]  # type: ignore[misc]


def split_scaffolding(repo: Path, upstream: str, head: str) -> tuple[str, list[str], list[str]]:
    """(local base, scaffolding commits, series commits) of upstream..head; scaffolding: the commits right above
    upstream that only delete files none of the later commits touch ("drop blogs/")."""
    commits = git_out(repo, "rev-list", "--reverse", "--first-parent", f"{upstream}..{head}").split()
    if not commits:
        raise errors.BadInput(f"no commits between {upstream[:12]} and {head[:12]}")
    if git_out(repo, "rev-list", "--min-parents=2", f"{upstream}..{head}").strip():
        raise errors.BadInput(f"{upstream[:12]}..{head[:12]} has merge commits; a series is a straight line")
    changes = {commit: _touched(repo, commit) for commit in commits}
    deletes_only = {c for c, touched in changes.items() if touched and all(s == "D" for s, _ in touched)}
    scaffolding = list(itertools.takewhile(deletes_only.__contains__, commits))
    series = commits[len(scaffolding):]
    if not series:
        raise errors.BadInput(f"{upstream[:12]}..{head[:12]} holds only file deletions: no series to format")
    dropped = {path for commit in scaffolding for _, path in changes[commit]}
    for commit in series:
        clash = dropped.intersection(path for _, path in changes[commit])
        if clash:
            raise errors.BadInput(f"{commit[:12]} touches {sorted(clash)[0]}, which a scaffolding commit deletes")
    local_base = scaffolding[-1] if scaffolding else _commit(repo, upstream)
    return local_base, scaffolding, series


def check_signoffs(repo: Path, commits: list[str]) -> None:
    for commit in commits:
        out = git_out(repo, "log", "-1", "--format=%an <%ae>%x00%s%x00%(trailers:key=Signed-off-by,valueonly)", commit)
        author, subject, trailers = (part.strip() for part in out.split("\0"))
        if author not in [t.strip() for t in trailers.splitlines()]:
            raise errors.BadInput(f"{commit[:12]} ({subject}) is not signed off by its author {author}: "
                                  f"git commit --amend -s")


def read_cover(path: Path) -> tuple[str, str]:
    subject, _, body = path.read_text().partition("\n")  # the subject line, a blank line, the body
    if not subject.strip():
        raise errors.BadInput(f"{path}: the first line must be the cover letter's subject")
    return subject.strip(), body.strip("\n")


def cover_from_patch(path: Path) -> tuple[str, str]:
    """(subject, body) of an existing cover letter written by format-patch."""
    text = path.read_text()
    subject = email_subject(text)
    if subject is None:
        raise errors.BadInput(f"{path}: no Subject: line")
    body_start = text.index("\n\n") + 2  # the headers end at the first blank line
    # The body ends where format-patch's shortlog starts: "Author Name (N):".
    shortlog = re.search(r"^\S.* \(\d+\):$", text[body_start:], re.M)
    body = text[body_start:body_start + shortlog.start()] if shortlog else text[body_start:]
    return subject, body.strip("\n")


def change_id(series_name: str, previous_letter: str) -> str:
    """b4's series identity: kept from the previous version's letter, else ``YYYYMMDD-<slug>-<hash>``."""
    found = re.search(r"^change-id: (\S+)$", previous_letter, re.M)
    if found:
        return found[1]
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
    slug = re.sub(r"[^a-z0-9]+", "-", f"zero3-sp-grad-scale-{series_name}".lower()).strip("-")
    return f"{day}-{slug}-{hashlib.sha1(series_name.encode()).hexdigest()[:12]}"


def _fill_cover(path: Path, subject: str, body: str, local_base: str, upstream: str, cid: str) -> None:
    text = path.read_text()
    if "*** SUBJECT HERE ***" not in text or "*** BLURB HERE ***" not in text:
        raise errors.BadInput(f"{path}: format-patch did not write the cover letter placeholders")
    text = text.replace("*** SUBJECT HERE ***", subject).replace("*** BLURB HERE ***", body)
    # The series was formatted on the local base; upstream knows only the real commit.
    text = re.sub(rf"^base-commit: {local_base}$", f"base-commit: {upstream}", text, flags=re.M)
    if f"base-commit: {upstream}" not in text:
        raise errors.BadInput(f"{path}: no base-commit line to rewrite")
    text = text.replace(f"base-commit: {upstream}\n", f"base-commit: {upstream}\nchange-id: {cid}\n", 1)
    path.write_text(text)


def _role(repo: Path, commit: str) -> str:
    """A commit's role (series.ROLES) from what it touches; docs/ with code is refused."""
    paths = [path for _, path in _touched(repo, commit)]
    in_tests = [p.startswith("tests/") for p in paths]
    in_docs = [p.startswith("docs/") for p in paths]
    # The ALST / Ulysses-HF tests, whose loss recipe relied on the bug, are a companion's: a companion may change
    # only them where a release has no tutorial to change.
    alst = any(p.startswith("tests/unit/ulysses_alst/") for p in paths)
    if all(t or d for t, d in zip(in_tests, in_docs)) and (any(in_docs) or alst):
        return "companion"
    if all(in_tests):
        return "test"
    if paths == [STAGE3] and re.search(rf"^\+{MARKER_NAME} = True$", git_out(repo, "show", "--format=", commit), re.M):
        return "marker"
    if not any(in_docs):
        return "fix"
    raise errors.BadInput(f"{commit[:12]} touches docs/ and code: split it, so that the fix alone applies to "
                          f"trees without docs/ (PyPI sdists)")


def update_manifest(manifest: Path, name: str, version: int, upstream: str, base_ref: str | None,
                    patches: list[tuple[str, str]]) -> None:
    """Rewrite version, base and patch list of one [[series]] block, leaving the rest as written (comments too)."""
    text = manifest.read_text()
    blocks = re.split(r"(?m)^(?=\[\[series\]\])", text)
    for i, block in enumerate(blocks):
        if re.search(rf'(?m)^name = "{re.escape(name)}"$', block):
            break
    else:
        raise errors.BadInput(f"{manifest}: no [[series]] named {name!r}; add one, then rerun")
    block = re.sub(r"(?m)^version = \d+$", f"version = {version}", block)
    block = re.sub(r'(?m)^base_commit = "[0-9a-f]*"$', f'base_commit = "{upstream}"', block)
    if base_ref:
        block = re.sub(r'(?m)^base_ref = ".*"$', f'base_ref = "{base_ref}"', block)
    listing = "patches = [\n" + "".join(f'    {{ file = "{f}", role = "{r}" }},\n' for f, r in patches) + "]"
    block, count = re.subn(r"(?ms)^patches = \[.*?^\]", listing, block)
    if count != 1:
        raise errors.BadInput(f"{manifest}: series {name!r} has no 'patches = [...]' list to update")
    blocks[i] = block
    manifest.write_text("".join(blocks))


def _manifest_base(manifest_path: Path, name: str) -> str:
    """The base_commit of a series, read raw: a new series may not list any patch yet."""
    try:
        blocks = load_toml(manifest_path).get("series", [])
    except (FileNotFoundError, TOMLDecodeError):
        blocks = []
    for block in blocks:
        if block.get("name") == name and block.get("base_commit"):
            return str(block["base_commit"])
    raise errors.BadInput(f"series {name!r} has no base_commit in {manifest_path}: pass --upstream")


def reroll(repo: Path, branch: str, series_name: str, version: int, *, upstream: str | None = None,
           base_ref: str | None = None, cover: Path | None = None, out: Path | None = None,
           previous: Path | None = None, manifest_path: Path = DEFAULT_MANIFEST, update: bool = True) -> Reroll:
    repo = repo.resolve()
    if version < 1:
        raise errors.BadInput("-v must be 1 or more")
    upstream = _commit(repo, _manifest_base(manifest_path, series_name) if upstream is None else upstream)
    head = _commit(repo, branch)
    local_base, scaffolding, commits = split_scaffolding(repo, upstream, head)
    check_signoffs(repo, commits)
    touched = sorted({path for c in commits for _, path in _touched(repo, c)})
    roles = [_role(repo, commit) for commit in commits]  # refuse a mixed commit before writing anything
    if local_base != upstream and git(repo, "diff", "--quiet", upstream, local_base, "--", *touched,
                                      check=False).returncode != 0:
        raise errors.BadInput("the scaffolding commits change files the series touches: base-commit would lie")

    out = (out or manifest_path.parent / series_name).resolve()
    previous = (previous or out).resolve()
    old_patches = sorted(previous.glob("0[0-9][0-9][0-9]-*.patch")) if previous.is_dir() else []
    old_letter = old_patches[0].read_text() if old_patches and old_patches[0].name.startswith("0000-") else ""
    cid = change_id(series_name, old_letter)
    if cover is not None:
        subject, body = read_cover(cover)
    elif old_patches and old_patches[0].name.startswith("0000-"):
        subject, body = cover_from_patch(old_patches[0])
    else:
        raise errors.BadInput("no previous cover letter to reuse: pass --cover FILE (subject line, blank, body)")

    with tempfile.TemporaryDirectory(prefix="zero3-sp-reroll.") as tmp:
        formatted = Path(tmp) / "formatted"
        where, extra, range_diff_text = repo, [], None
        if version > 1:
            if not old_patches:
                raise errors.BadInput(f"-v {version}: no previous version in {previous} to range-diff against")
            old_local_base, old_head, where = _rebuild_previous(repo, old_patches, old_letter, Path(tmp))
            extra = [f"--range-diff={old_local_base}..{old_head}"]
            range_diff_text = git_out(where, *FORMAT_CONFIG, "range-diff", "--no-color",
                                      f"{old_local_base}..{old_head}", f"{local_base}..{head}")
        # The cover letter is from the series' author, not from whoever runs this (a project identity).
        name, email = git_out(repo, "log", "-1", "--format=%an%n%ae", head).splitlines()
        as_author = {**os.environ, "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}
        git_out(where, *FORMAT_CONFIG, "format-patch", "-q", "--cover-letter", f"--base={local_base}", "-v",
                str(version), *extra, "-o", str(formatted), f"{local_base}..{head}", env=as_author)
        files = sorted(formatted.glob("*.patch"))
        _fill_cover(files[0], subject, body, local_base, upstream, cid)

        out.mkdir(parents=True, exist_ok=True)
        for stale in [*out.glob("0[0-9][0-9][0-9]-*.patch"), *out.glob("range-diff-v*-v*.txt")]:
            stale.unlink()  # older versions kept their range-diff in a file too: the letter is the one place now
        written = [out / f.name.removeprefix(f"v{version}-") for f in files]
        for f, target in zip(files, written):
            shutil.copyfile(f, target)

    if update and manifest_path.exists():
        update_manifest(manifest_path, series_name, version, upstream, base_ref,
                        [(path.name, role) for path, role in zip(written[1:], roles)])
    return Reroll(series=series_name, version=version, upstream=upstream, local_base=local_base, head=head,
                  files=tuple(written), range_diff=range_diff_text, change_id=cid, scaffolding=tuple(scaffolding))


def _rebuild_previous(repo: Path, old_patches: list[Path], old_letter: str, tmpdir: Path) -> tuple[str, str, Path]:
    """The previous version's commits, rebuilt in a scratch clone: (local base, head, clone)."""
    match = re.search(r"^base-commit: ([0-9a-f]{40})$", old_letter, re.M)
    if not match:
        raise errors.BadInput(f"{old_patches[0]}: the previous version has no base-commit: line")
    old_base, scratch = match[1], tmpdir / "previous"
    clone_shared(repo, scratch)
    _commit(scratch, old_base)
    local_base, _ = prepare_working_copy(scratch, old_base, "previous")
    patches = [str(p) for p in old_patches if not p.name.startswith("0000-")]
    result = git(scratch, "am", "--no-3way", "--quiet", *patches, check=False, env={**os.environ, **FIXED_IDENTITY})
    if result.returncode != 0:
        raise errors.BadInput(f"the previous version does not apply to its own base {old_base[:12]}: "
                              f"{(result.stderr or result.stdout).strip().splitlines()[0]}")
    return local_base, _commit(scratch, "HEAD"), scratch


def main(argv: list[str] | None = None) -> int:
    parser = errors.CommandParser(
        prog="zero3-sp reroll", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Regenerate one patch series (format-patch --cover-letter --base -v N) from a DeepSpeed "
        "branch, write it under patches/<series>/ and update patches/series.toml; for N > 1 the cover letter "
        "carries the range-diff against the previous version.", epilog="""examples:
  # first version of the master series; the cover text is subject line, blank line, body
  zero3-sp reroll --repo ~/ds --branch zero3-sp-fix --series master -v 1 --cover cover.txt

  # after amending the commits: v2, cover letter and change-id reused from v1, range-diff in the letter
  zero3-sp reroll --repo ~/ds --branch zero3-sp-fix --series master -v 2

  # the same series rebased onto a newer upstream master
  zero3-sp reroll --repo ~/ds --branch zero3-sp-fix --series master -v 3 \\
      --upstream origin/master --base-ref master

The branch may start with local commits that only delete files (a repo with missing blobs needs
one, see docs/runtime-facts.md); they are left out and base-commit: names the real upstream commit. Every commit
must be signed off by its author (git commit -s). Exit codes: 0 done, 2 bad input.""")
    parser.add_argument("--repo", type=Path, required=True, help="DeepSpeed git repo holding the branch")
    parser.add_argument("--branch", required=True, help="branch (or commit) whose commits form the series")
    parser.add_argument("--series", required=True, help="series name in patches/series.toml, e.g. master")
    parser.add_argument("-v", "--reroll-count", dest="version", type=int, required=True,
                        help="series version N (format-patch -v N)")
    parser.add_argument(
        "--upstream", help="real upstream commit the branch is built on "
        "(default: the series' base_commit in the manifest)")
    parser.add_argument("--base-ref", help="tag or branch name of --upstream, recorded in the manifest")
    parser.add_argument(
        "--cover", type=Path, help="cover letter text: subject line, blank line, body "
        "(default: reuse the previous version's)")
    parser.add_argument("--previous", type=Path, help="folder of the previous version (default: --out)")
    parser.add_argument("--out", type=Path, help="where to write the series (default: patches/<series>)")
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST, help="default: %(default)s")
    parser.add_argument("--no-manifest-update", action="store_true", help="leave series.toml alone")
    args = parser.parse_args(argv)
    try:
        result = reroll(args.repo, args.branch, args.series, args.version, upstream=args.upstream,
                        base_ref=args.base_ref, cover=args.cover, out=args.out, previous=args.previous,
                        manifest_path=args.manifest, update=not args.no_manifest_update)
    except errors.PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    for commit in result.scaffolding:
        print(f"left out local scaffolding commit {commit[:12]} (deletes files only)")
    print(f"series {result.series} v{result.version} on {result.upstream}: "
          f"{len(result.files)} files in {result.files[0].parent}")
    for path in result.files:
        print(f"  {path.name}")
    print(f"  change-id: {result.change_id}" + ("; range-diff in the cover letter" if result.range_diff else ""))
    return 0
