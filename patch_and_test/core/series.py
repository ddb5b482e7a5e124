"""The patch series (``patches/series.toml``): pick one for a tree, tell whether it has the fix, ``git am`` it
all or nothing."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import packaging.version

from patch_and_test import DATA_ROOT
from patch_and_test.core import errors
from patch_and_test.core.gitrun import FIXED_IDENTITY, git  # noqa: F401 (git re-exported: callers import it from here)
from repro.downstream.expect import MARKER_NAME  # noqa: F401 (re-exported for the pipeline)
from repro.harness.fixed import source_has_fix
from repro.harness.files import TOMLDecodeError, load_toml
from repro.harness.report import Record

DEFAULT_MANIFEST = DATA_ROOT / "patches" / "series.toml"
STAGE3 = "deepspeed/runtime/zero/stage3.py"

Version = tuple[int, int, int]

# role -> the top-level folders of the tree the patch needs besides the code (CONTRIBUTING.md, "The series"). A
# fix may also edit tests/: those hunks are left out on a tree without tests/ (git am --exclude).
ROLES: dict[str, tuple[str, ...]] = {"fix": (), "test": ("tests", ), "companion": ("tests", "docs"), "marker": ()}


def parse_version(text: str) -> Version:
    """``v0.19.6``, ``0.19.6+fe7b53c``, ``0.19.6.dev0`` -> (0, 19, 6): a suffix maps to the release it leads up to
    (master's version.txt names the next release); fewer than three numbers are refused."""
    try:
        parsed = packaging.version.Version(text.strip())
    except packaging.version.InvalidVersion:
        parsed = None
    if parsed is None or parsed.epoch or len(parsed.release) != 3:
        raise errors.UnknownVersion(f"cannot read a DeepSpeed version from {text.strip()!r}")
    return parsed.release


def public_version(text: str) -> str:
    """A version without its local part (``0.19.8+unknown`` -> ``0.19.8``), as a reader installs it; else as given."""
    try:
        return packaging.version.Version(text).public
    except packaging.version.InvalidVersion:
        return text


def version_sort_key(text: str) -> Version | tuple[()]:
    """The version inside ``text`` ("0.19.6+fe7b53c", "patch-and-test-ds0.19.8-gloo"), to sort by; () for none."""
    found = re.search(r"v?\d+\.\d+\.\d+\S*?(?=-[a-z]|$)", str(text))
    try:
        return parse_version(found.group(0)) if found else ()
    except errors.UnknownVersion:
        return ()


def format_version(version: Version) -> str:
    return ".".join(map(str, version))


SUBJECT = re.compile(r"^Subject: (.*(?:\n .*)*)", re.M)  # a format-patch header, folded lines included


def email_subject(text: str) -> str | None:
    """The Subject of a format-patch email, unfolded and without its ``[PATCH ...]`` tag, as ``git am`` reads it."""
    match = SUBJECT.search(text)
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(match[1].split())) if match else None


def touched_files(*patches: Path) -> list[str]:
    """The paths the patches' diffs leave in the tree, each once, in the order first touched."""
    found = (m[1] for p in patches if p.exists()
             for m in re.finditer(r"^\+\+\+ b/(.+)$", p.read_text(errors="replace"), re.M))
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Patch:
    file: str  # file name inside the series directory
    path: Path
    role: str  # one of ROLES

    @property
    def subject(self) -> str:
        """Its commit's title; the file's name when it has none or is missing."""
        return (email_subject(self.path.read_text(errors="replace")) if self.path.exists() else None) or self.path.name

    @property
    def files(self) -> list[str]:
        return touched_files(self.path)

    @property
    def needs_dirs(self) -> tuple[str, ...]:
        return ROLES[self.role]


@dataclass(frozen=True)
class Series:
    name: str
    version: int  # the series' own version: v1, v2 after a reroll, ...
    min_version: Version  # inclusive
    below_version: Version  # exclusive
    base_commit: str  # the real upstream commit the series was made on
    base_ref: str  # the tag or branch that commit was
    directory: Path
    cover_letter: Path
    patches: tuple[Patch, ...]

    def covers(self, version: Version) -> bool:
        return self.min_version <= version < self.below_version

    @property
    def range_text(self) -> str:
        return f">={format_version(self.min_version)},<{format_version(self.below_version)}"

    @property
    def fix_patches(self) -> tuple[Patch, ...]:  # what applies to a PyPI sdist: the fix, and a backport's marker
        return tuple(p for p in self.patches if not p.needs_dirs)

    @property
    def test_patches(self) -> tuple[Patch, ...]:  # roles test and companion: they need tests/, which an sdist lacks
        return tuple(p for p in self.patches if p.needs_dirs)

    @property
    def companion_patches(self) -> tuple[Patch, ...]:
        return tuple(p for p in self.patches if p.role == "companion")

    def record(self, **applied) -> ChosenSeries:
        """The series as a run's verdict records it; ``apply_series`` adds what applied to the tree and what not."""
        return ChosenSeries(name=self.name, version=self.version, base_commit=self.base_commit, base_ref=self.base_ref,
                            range=self.range_text, **applied)


@dataclass(frozen=True)
class Manifest:
    path: Path
    series: tuple[Series, ...]

    def by_name(self, name: str) -> Series:
        if found := next((series for series in self.series if series.name == name), None):
            return found
        names = ", ".join(s.name for s in self.series)
        raise errors.BadInput(f"no series named {name!r} in {self.path} (have: {names})")

    @property
    def bounds(self) -> tuple[Version, Version]:
        return min(s.min_version for s in self.series), max(s.below_version for s in self.series)

    @property
    def supported_range(self) -> str:  # the series may leave gaps (none today)
        return ">={},<{}".format(*map(format_version, self.bounds))


def load_manifest(path: Path | str | None = None) -> Manifest:
    path = Path(path) if path is not None else DEFAULT_MANIFEST
    try:
        data = load_toml(path)
    except FileNotFoundError:
        raise errors.BadInput(f"manifest not found: {path}") from None
    except TOMLDecodeError as exc:
        raise errors.BadInput(f"{path}: not valid TOML: {exc}") from None
    if data.get("schema") != 1:
        raise errors.BadInput(f"{path}: unsupported schema {data.get('schema')!r} (expected 1)")

    series: list[Series] = []
    for raw in data.get("series", []):
        name = raw.get("name")
        where = f"{path}: series {name!r}"
        if not name:
            raise errors.BadInput(f"{path}: a [[series]] without a name")
        directory = path.parent / raw.get("directory", name)
        patches = []
        for entry in raw.get("patches", []):
            role = entry.get("role")
            if role not in ROLES:
                raise errors.BadInput(f"{where}: patch {entry.get('file')!r} has role {role!r} ({'|'.join(ROLES)})")
            patches.append(Patch(file=entry["file"], path=directory / entry["file"], role=role))
        if not patches:
            raise errors.BadInput(f"{where}: no patches")
        base_commit = str(raw.get("base_commit", ""))
        if not re.fullmatch(r"[0-9a-f]{40}", base_commit):
            raise errors.BadInput(f"{where}: base_commit must be a full 40-hex commit id")
        if missing := [key for key in ("min_version", "below_version") if key not in raw]:
            raise errors.BadInput(f"{where}: missing {missing[0]!r}")
        low, below = (parse_version(str(raw[key])) for key in ("min_version", "below_version"))
        series.append(
            Series(name=name, version=int(raw.get("version", 1)), min_version=low, below_version=below,
                   base_commit=base_commit, base_ref=str(raw.get("base_ref", "")), directory=directory,
                   cover_letter=directory / raw.get("cover_letter", "0000-cover-letter.patch"),
                   patches=tuple(patches)))
    if not series:
        raise errors.BadInput(f"{path}: no [[series]]")
    ordered = sorted(series, key=lambda s: s.min_version)
    for lower, upper in zip(ordered, ordered[1:]):
        if lower.below_version > upper.min_version:
            raise errors.BadInput(f"{path}: series {lower.name!r} and {upper.name!r} overlap")
    return Manifest(path=path, series=tuple(ordered))


def series_for_version(version: str, manifest: Manifest | None = None) -> Series:
    manifest = manifest or load_manifest()
    parsed = parse_version(version)
    if found := next((series for series in manifest.series if series.covers(parsed)), None):
        return found
    low, high = manifest.bounds
    gap = " (a gap between series: see the manifest)" if low <= parsed < high else ""
    raise errors.UnknownVersion(f"DeepSpeed {format_version(parsed)} is not supported{gap}: "
                                f"supported versions are {manifest.supported_range} "
                                f"({', '.join(f'{s.name}: {s.range_text}' for s in manifest.series)})")


def _tree_file(tree: Path | str, rel: str) -> str:
    try:
        return (Path(tree) / rel).read_text()
    except FileNotFoundError:
        raise errors.BadInput(f"{tree} has no {rel}: not a DeepSpeed source tree") from None


def series_for_tree(tree: Path | str, manifest: Manifest | None = None) -> Series:
    return series_for_version(_tree_file(tree, "version.txt").strip(), manifest)


def tree_has_fix(tree: Path | str) -> bool:
    """Whether the tree's stage3.py ``__avg_scatter_grads`` already accounts for sequence parallelism."""
    try:
        return source_has_fix(_tree_file(tree, STAGE3))
    except SyntaxError as exc:
        raise errors.BadInput(f"{Path(tree) / STAGE3} does not parse as Python: {exc}") from None


def work_tree_root(path: Path | str) -> Path:
    """The root of the git work tree at ``path``, or NotACheckout."""
    path = Path(path)
    if not path.is_dir():
        raise errors.NotACheckout(f"{path} is not a directory")
    result = git(path, "rev-parse", "--is-inside-work-tree", "--show-toplevel", check=False)
    lines = result.stdout.splitlines()
    if result.returncode != 0 or not lines or lines[0] != "true":
        raise errors.NotACheckout(f"{path} is not a git work tree")
    root = Path(lines[1]).resolve()
    if root != path.resolve():
        raise errors.NotACheckout(f"{path} is inside the git work tree {root}; pass its root")
    if git(root, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode != 0:
        raise errors.NotACheckout(f"{path} is a git work tree without any commit")
    return root


def ensure_clean(root: Path) -> None:
    """DirtyCheckout unless nothing is staged, modified, untracked (not ignored) or half-applied."""
    for marker in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD"):
        path = Path(git(root, "rev-parse", "--git-path", marker).stdout.strip())
        if (path if path.is_absolute() else root / path).exists():
            raise errors.DirtyCheckout(f"{root}: a git am, rebase, merge or cherry-pick is in progress")
    # --no-optional-locks: a status must not rewrite the index of a tree we only inspect.
    status = git(root, "--no-optional-locks", "status", "--porcelain", "--untracked-files=normal").stdout
    if status.strip():
        paths = [line[3:] for line in status.splitlines()]
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        raise errors.DirtyCheckout(f"{root} has uncommitted changes ({shown}); commit or stash them first")


class SkippedPatch(Record):
    file: str
    reason: str


class ChosenSeries(Record):
    """The series chosen for a run's tree; once applied (not on a tree that had the fix), what applied and what not."""

    name: str
    version: int
    base_commit: str
    base_ref: str
    range: str
    applied: tuple[str, ...] | None = None
    skipped: tuple[SkippedPatch, ...] | None = None
    base: str | None = None  # HEAD before the series
    head: str | None = None  # HEAD after it: the resulting commit

    def summary(self) -> str:  # once applied
        skips = "".join(f"\nskipped {skip.file}: {skip.reason}" for skip in self.skipped)
        return f"applied series {self.name} v{self.version}: {len(self.applied)} patch(es) -> {self.head[:12]}{skips}"


def _identity_env(root: Path) -> dict:
    """git am commits: give it the fixed committer when the repo and the user have none configured."""
    if git(root, "var", "GIT_COMMITTER_IDENT", check=False).returncode == 0:
        return dict(os.environ)
    return {**{key: FIXED_IDENTITY[key] for key in ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")}, **os.environ}


def _state(root: Path) -> tuple[str, str]:
    head = git(root, "rev-parse", "HEAD").stdout.strip()
    ref = git(root, "symbolic-ref", "-q", "HEAD", check=False).stdout.strip()
    return head, ref


def _restore(root: Path, head: str, ref: str) -> None:
    """Undo a failed ``git am`` session: back to the HEAD, branch, index and files it started from."""
    git(root, "am", "--abort", check=False)
    if _state(root) != (head, ref) or git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        # Belt and braces: am --abort already resets to where the session began.
        if ref:
            git(root, "update-ref", ref, head)
            git(root, "symbolic-ref", "HEAD", ref)
        else:
            git(root, "update-ref", "--no-deref", "HEAD", head)
        git(root, "reset", "-q", "--hard", head)


def apply_series(repo: Path | str, series: Series) -> ChosenSeries:
    """``git am`` the series onto ``repo``'s branch, all or nothing; patches needing folders the tree lacks are skipped
    and reported."""
    root = work_tree_root(Path(repo))
    ensure_clean(root)
    if tree_has_fix(root):
        raise errors.AlreadyFixed(f"{root}: {STAGE3} __avg_scatter_grads already accounts for "
                                  f"sequence_parallel_size; nothing to apply")
    to_apply, skipped = [], []
    for patch in series.patches:
        if not patch.path.is_file():
            raise errors.BadInput(f"series {series.name}: patch file missing: {patch.path}")
        missing = [f"{d}/" for d in patch.needs_dirs if not (root / d).is_dir()]
        if missing:
            needs = " and ".join(f"{d}/" for d in patch.needs_dirs)
            reason = f"needs {needs}, which this tree does not have (no {' or '.join(missing)}; a PyPI sdist has none)"
            skipped.append(SkippedPatch(file=patch.file, reason=reason))
        else:
            to_apply.append(patch)

    head, ref = _state(root)
    if to_apply:
        # A fix patch's hunks under a folder the tree lacks (see ROLES); the patches that need it were skipped above.
        excludes = [f"--exclude={d}/*" for d in ("tests", "docs") if not (root / d).is_dir()]
        result = git(root, "am", "--no-3way", "--quiet", *excludes, *[str(p.path) for p in to_apply], check=False,
                     env=_identity_env(root))
        if result.returncode != 0:
            failed = _failed_patch(root, to_apply, head)
            reason = _first_error_line(result.stderr or result.stdout)
            _restore(root, head, ref)
            raise errors.SeriesDoesNotApply(f"series {series.name} v{series.version}: {failed} does not apply to "
                                            f"{root} ({reason}); the tree is back at {head[:12]}")
    return series.record(applied=tuple(p.file for p in to_apply), skipped=tuple(skipped), base=head,
                         head=_state(root)[0])


def _failed_patch(root: Path, patches: Sequence[Patch], start: str) -> str:
    # Every patch is one commit: the count of commits made before the failure names the culprit.
    made = int(git(root, "rev-list", "--count", f"{start}..HEAD", check=False).stdout.strip() or 0)
    return patches[made].file if made < len(patches) else "the series"


def _first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith(("error:", "fatal:"))),
                lines[0] if lines else "git am failed")


def commit_patches(repo: Path, base: str, patches: Sequence[Path], scratch: Path,
                   env: dict | None = None) -> list[str]:
    """The commits ``git am`` would make of ``patches`` on ``base``, made with plumbing on an index in ``scratch``: no
    work tree, no ref moves, and blobs the patches do not touch may be missing (the mirror's)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(env or {}), "GIT_INDEX_FILE": str(scratch / "index")}
    git(repo, "read-tree", base, env=env)
    msg, diff = scratch / "msg", scratch / "diff"
    made: list[str] = []
    for patch in patches:
        # Its headers, message and diff, as git am reads them.
        out = git(None, "mailinfo", str(msg), str(diff), input=patch.read_bytes(), text=False).stdout.decode()
        info = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        message = msg.read_text()
        applied = git(repo, "apply", "--cached", "--whitespace=nowarn", str(diff), check=False, env=env)
        if applied.returncode != 0:
            why = "; ".join(line.strip() for line in applied.stderr.splitlines() if line.strip()) or "git apply failed"
            raise errors.SeriesDoesNotApply(f"{patch.name} does not apply to {base[:12]}: {why}")
        tree = git(repo, "write-tree", "--missing-ok", env=env).stdout.strip()
        author = dict(GIT_AUTHOR_NAME=info["Author"], GIT_AUTHOR_EMAIL=info["Email"], GIT_AUTHOR_DATE=info["Date"])
        text = f"{info['Subject']}\n\n{message}" if message.strip() else f"{info['Subject']}\n"
        made.append(
            git(repo, "commit-tree", tree, "-p", made[-1] if made else base, input=text,
                env=env | author).stdout.strip())
    return made


def differences_from_git_am(repo: Path, ours_base: str, ours: Sequence[str], am_base: str, am: Sequence[str],
                            dropped: Iterable[str] = ()) -> list[str]:
    """How ``ours`` differ from ``git am``'s commits but for ids and committers, one line each (``dropped`` paths
    aside: a local commit left them out of git am's base)."""
    if len(ours) != len(am):
        return [f"differs from git am: {len(ours)} commits where it made {len(am)}"]
    dropped = tuple(d.rstrip("/") for d in dropped)
    problems = []
    for i, (our_parent, our, am_parent, theirs) in enumerate(zip([ours_base, *ours], ours, [am_base, *am], am), 1):
        differ = git(repo, "diff", "--name-only", "-z", theirs, our).stdout.split("\0")
        stray = [p for p in differ if p and not any(p == d or p.startswith(d + "/") for d in dropped)]
        if stray:
            problems.append(f"commit {i}: its tree differs from git am's in {stray[:3]}")
        if git(repo, "diff", "--binary", our_parent, our).stdout != git(repo, "diff", "--binary", am_parent,
                                                                        theirs).stdout:
            problems.append(f"commit {i}: its diff from its parent differs from git am's")
        show = ("show", "-s", "--format=%an <%ae> %ad%n%B")
        if git(repo, *show, our).stdout != git(repo, *show, theirs).stdout:
            problems.append(f"commit {i}: its author, date or message differs from git am's")
    return problems


def differences_from_patches(repo: Path, commits: Sequence[str], patches: Sequence[Path]) -> list[str]:
    """Each commit whose diff is not its patch's by ``git patch-id --stable`` (blind to offsets and index lines)."""

    def patch_id(text: str) -> str:
        return git(repo, "patch-id", "--stable", input=text).stdout.split(" ")[0]

    if len(commits) != len(patches):
        return [f"{len(commits)} commits for {len(patches)} patches"]
    return [
        f"commit {i}: its diff is not {patch.name}'s" for i, (commit, patch) in enumerate(zip(commits, patches), 1)
        if not patch_id(patch.read_text()) or patch_id(git(repo, "show", commit).stdout) != patch_id(patch.read_text())
    ]
