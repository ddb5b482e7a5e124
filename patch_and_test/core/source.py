"""A DeepSpeed tree to patch (PyPI sdist, checkout, mirror commit, newest-upstream graft): always a cached working
copy one caller holds alone; a user's repo is only read."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from pydantic import Field

from patch_and_test.core import errors
from patch_and_test.core.gitrun import FIXED_IDENTITY, git_out
from patch_and_test.core.inputs import sha256_file
from repro.harness.env import cache_root
from repro.harness.files import load_toml
from repro.harness.report import Record
from patch_and_test import DATA_ROOT
from patch_and_test.core.series import (STAGE3, Series, ensure_clean, format_version, git, parse_version,
                                        series_for_version, work_tree_root)

DEFAULT_LOCK = DATA_ROOT / "deepspeed-sdists.lock"

# Build outputs an install writes into the tree (the sdist ships some): committed, the tree would turn dirty. The
# sdist's (empty) build.txt is not one: it is how DeepSpeed's setup.py knows it builds a release, which it then
# calls by its number alone; without it a build from an export (no .git) says <release>+unknown.
SDIST_EXCLUDES = ("deepspeed.egg-info/", "deepspeed/git_version_info_installed.py", "build/", "dist/", "*.so",
                  "__pycache__/", "*.pyc")
# What an sdist repo holds, by number (2: build.txt kept). A change gets a new number, hence a new folder beside the
# old one: the working copies of an old repo (clones --shared of it) keep the objects they read.
SDIST_LAYOUT = 2
# What a newest-upstream tree takes from the sdist, as whole folders; the rest stays the mirror master's.
GRAFTED_PATHS = ("accelerator", "bin", "csrc", "deepspeed", "op_builder", "requirements", "setup.py", "version.txt")


class Graft(Record):
    """A newest-upstream commit: the sdist of ``release`` over ``history`` (both recorded in the verdict)."""

    commit: str
    release: str
    sdist_sha256: str
    history: str  # the mirror's master commit: parent of the graft, source of tests/ and docs/
    history_date: str


class SourceRecord(Record):
    """Where a run's DeepSpeed tree came from, as its verdict records it (``SourceTree`` less the lock)."""

    origin: str  # "pypi-sdist", "checkout", "mirror" or "newest-upstream"
    path: str
    version: str  # from its version.txt
    upstream_commit: str | None  # the DeepSpeed commit it was made from (None for an sdist; the graft's id)
    base: str  # the local commit to apply a series onto (HEAD when returned)
    branch: str
    has_tests: bool
    dropped_paths: tuple[str, ...]
    graft: Graft | None = None  # newest-upstream: what the tree is made of (absent in verdicts written before)


class SourceTree(SourceRecord):
    """A git work tree that is ours to patch, locked by ``claim`` until ``release``."""

    path: Path
    dropped_paths: tuple[str, ...] = ()  # left out because their blobs are missing
    series_name: str | None = None  # the series this origin takes whatever its version.txt says
    claim: Any = Field(default=None, exclude=True, repr=False)

    def release(self) -> None:
        if self.claim is not None:
            self.claim.close()

    def record(self) -> SourceRecord:
        return SourceRecord.model_validate(self.model_dump(mode="json", include=set(SourceRecord.model_fields)))


def mirror_path() -> Path:
    """A git clone (bare or not) of DeepSpeed with its tags: ``DEEPSPEED_MIRROR``, else the cache's one."""
    return Path(os.environ.get("DEEPSPEED_MIRROR") or cache_root() / "deepspeed-mirror")


@dataclass(frozen=True)
class LockEntry:
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class NewestUpstream:  # the lock's [newest-upstream]: which release is grafted onto which master commit
    release: str
    history: str  # a full commit id of the mirror's master


def _lock_toml(path: Path) -> dict:
    try:
        return load_toml(path)
    except FileNotFoundError:
        raise errors.BadInput(f"sdist lock file not found: {path}") from None


def load_newest_upstream(path: Path | None = None) -> NewestUpstream:
    path = path or DEFAULT_LOCK
    table = _lock_toml(path).get("newest-upstream")
    if not isinstance(table, dict) or not {"release", "history"} <= table.keys():
        raise errors.BadInput(f"{path}: no [newest-upstream] table with release and history")
    return NewestUpstream(str(table["release"]), str(table["history"]))


def load_lock(path: Path | None = None) -> dict[str, LockEntry]:
    entries = _lock_toml(path or DEFAULT_LOCK).get("sdist", {})
    return {version: LockEntry(version, entry["filename"], entry["sha256"]) for version, entry in entries.items()}


def newest_locked() -> str:  # the job's and the tests' default DeepSpeed
    return max(load_lock(), key=parse_version)


def pip_command() -> list[str]:
    """How to run pip here: this interpreter's, else the one on PATH."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    if found := shutil.which("pip3") or shutil.which("pip"):
        return [found]
    raise errors.BadInput("pip is needed to download DeepSpeed sdists and none was found")


def _pip(what: str, *args: str) -> str:
    result = subprocess.run([*pip_command(), *args], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise errors.BadInput(f"pip {what} failed: {tail[0]}")
    return result.stdout


def download_sdist(version: str, dest: Path, package: str = "deepspeed") -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    _pip(f"download {package}=={version}", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(dest),
         f"{package}=={version}")
    found = sorted(dest.glob(f"{package}-{version}.tar.gz"))
    if not found:
        raise errors.BadInput(f"pip download {package}=={version} gave no {package}-{version}.tar.gz")
    return found[0]


def released_versions() -> list[str]:
    """Every DeepSpeed release the package index lists, newest first; pip leaves out pre-releases and yanked ones."""
    return parse_index_versions(_pip("index versions deepspeed", "index", "versions", "deepspeed"))


def parse_index_versions(text: str) -> list[str]:
    for line in text.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise errors.BadInput("pip index versions printed no 'Available versions:' line")


def sdist_path(version: str, lock: dict[str, LockEntry] | None = None, cache: Path | None = None) -> Path:
    entry = (lock if lock is not None else load_lock()).get(version)
    return (cache or cache_root()) / "sdists" / (entry.filename if entry else f"deepspeed-{version}.tar.gz")


def fetch_sdist(version: str, lock: dict[str, LockEntry] | None = None, cache: Path | None = None, *,
                require_lock: bool = True) -> Path:
    """The sdist of ``version`` (downloaded once, cached), checked against the lock; unlocked: refused or pip's."""
    lock = lock if lock is not None else load_lock()
    entry = lock.get(version)
    if entry is None and require_lock:
        raise errors.UnknownVersion(f"no sdist of DeepSpeed {version} in the lock file "
                                    f"(locked: {', '.join(sorted(lock, key=parse_version))})")
    archive = sdist_path(version, lock, cache)
    if not archive.is_file() or (entry is not None and sha256_file(archive) != entry.sha256):
        # Download beside sdists/ (same file system): the rename below is atomic.
        with tempfile.TemporaryDirectory(dir=_mkdir(archive.parent.parent)) as tmp:
            downloaded = download_sdist(version, Path(tmp))
            if entry is not None:
                digest = sha256_file(downloaded)
                if downloaded.name != entry.filename or digest != entry.sha256:
                    raise errors.BadInput(f"{downloaded.name}: sha256 {digest} does not match the lock "
                                          f"({entry.filename} {entry.sha256})")
            _mkdir(archive.parent)
            os.replace(downloaded, archive)
    return archive


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _unpack(archive: Path, dest: Path) -> None:
    """Unpack the sdist's single top-level folder into dest, refusing paths that leave it."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        if len(tops) != 1:
            raise errors.BadInput(f"{archive.name}: expected one top-level folder, found {sorted(tops)[:3]}")
        top = tops.pop()
        for member in members:
            rel = member.name[len(top):].lstrip("/")
            if not rel:
                continue
            if rel.startswith("/") or ".." in Path(rel).parts or member.issym() or member.islnk():
                raise errors.BadInput(f"{archive.name}: refusing member {member.name!r}")
            member.name = rel
            # Python >= 3.11.4: let tarfile vet the member too.
            tar.extract(member, dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


def from_pypi(version: str, cache: Path | None = None, lock: dict[str, LockEntry] | None = None, *,
              require_lock: bool = True) -> SourceTree:
    """A working copy of the repo made from the PyPI sdist of ``version`` (its sha256 in the commit message)."""
    cache = cache or cache_root()
    version = format_version(parse_version(version))
    repo = _sdist_repo(version, cache, lock, require_lock)
    # The cached repo is only read (its tag names the pristine commit); the series goes onto a copy of it.
    return _copy(repo, "sdist", f"pypi-{version}", "main", cache, origin="pypi-sdist", upstream_commit=None)


def _sdist_repo(version: str, cache: Path, lock: dict[str, LockEntry] | None, require_lock: bool = True) -> Path:
    """The repo of the sdist of ``version``, made once: its files less ``SDIST_EXCLUDES``, committed, tagged sdist."""
    repo = cache / "pypi" / f"v{SDIST_LAYOUT}" / f"deepspeed-{version}"

    def build(staging: Path) -> None:
        archive = fetch_sdist(version, lock, cache, require_lock=require_lock)
        _unpack(archive, staging)
        git_out(staging, "init", "-q", "-b", "main")
        (staging / ".git" / "info" / "exclude").write_text("\n".join(SDIST_EXCLUDES) + "\n")
        git_out(staging, "-c", "core.autocrlf=false", "add", "-A")
        _commit_fixed(staging,
                      f"DeepSpeed {version} from the PyPI sdist\n\n{archive.name} sha256 {sha256_file(archive)}")
        git_out(staging, "tag", "sdist")

    _build_once(repo, "refs/tags/sdist", build)
    return repo


def _build_once(repo: Path, tag: str, build: Callable[[Path], None]) -> None:
    """Unless ``repo`` holds ``tag`` already: ``build`` it in a scratch folder beside it, then rename that into place,
    so that an interrupted build never looks like a cache hit."""
    if (repo / ".git").is_dir() and git(repo, "rev-parse", "-q", "--verify", tag, check=False).returncode == 0:
        return
    if repo.exists():
        shutil.rmtree(repo)
    with tempfile.TemporaryDirectory(prefix=f"{repo.name}.", dir=_mkdir(repo.parent),
                                     ignore_cleanup_errors=True) as tmp:
        build(Path(tmp) / "repo")
        os.replace(Path(tmp) / "repo", repo)


def sdist_digest(tree: SourceTree) -> str | None:
    found = re.search(r"\.tar\.gz sha256 ([0-9a-f]{64})$", git_out(tree.path, "show", "-s", "--format=%B", tree.base),
                      re.MULTILINE)
    return found.group(1) if found else None


def _commit_fixed(repo: Path, message: str) -> None:
    git_out(repo, "-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m", message,
            env=os.environ | FIXED_IDENTITY)


def checkout_sparse(clone: Path, commit: str, branch: str | None = None) -> tuple[str, ...]:
    """Check ``commit`` out onto ``branch`` (None: detached), leaving out (and returning) paths without blobs."""
    entries = [(sha, path) for mode, sha, path in _tree_entries(clone, commit) if mode != "160000"]  # no submodules
    check = git_out(clone, "cat-file", "--batch-check=%(objectname) %(objecttype)", input="".join(
        f"{sha}\n" for sha, _ in entries)) if entries else ""
    missing = tuple(path for (_, path), line in zip(entries, check.splitlines()) if line.endswith(" missing"))
    if missing:
        # gitignore-style patterns: escape the characters that would otherwise be wildcards.
        patterns = ["/*"] + ["!/" + "".join("\\" + c if c in "*?[]!#\\" else c for c in p) for p in missing]
        git_out(clone, "sparse-checkout", "set", "--no-cone", "--stdin", input="\n".join(patterns) + "\n")
    elif git(clone, "config", "--bool", "core.sparseCheckout", check=False).stdout.strip() == "true":
        # A reused copy excluded paths for another commit: this one has every blob.
        git_out(clone, "sparse-checkout", "disable")
    git_out(clone, "checkout", "-q", "-f", *(("-B", branch) if branch else ("--detach", )), commit)
    return missing


def prepare_working_copy(clone: Path, commit: str, branch: str) -> tuple[str, tuple[str, ...]]:
    """``checkout_sparse``, the missing paths dropped in one local commit: (the commit to apply onto, those paths)."""
    missing = checkout_sparse(clone, commit, branch)
    if missing:
        git_out(clone, "rm", "-q", "-r", "--cached", "--sparse", "--pathspec-from-file=-", "--pathspec-file-nul",
                input="\0".join(missing))
        _commit_fixed(
            clone, f"Drop {len(missing)} path(s) whose blobs this repo lacks\n\n"
            "Local only (zero3-sp-gradfix): lets git am commit on a history with missing blobs.\n"
            "The series' base-commit is the parent of this commit.")
    return git_out(clone, "rev-parse", "HEAD").strip(), missing


def clone_shared(source: Path, dest: Path) -> None:  # reads source's objects, writes only into dest
    git_out(None, "clone", "-q", "--shared", "--no-checkout", str(source), str(dest))


_MAX_COPIES = 64  # working copies of one source held at once; more means jobs that never ended


def _claim(first: Path) -> tuple[Path, IO]:
    """The first of ``first``, ``first-2``, ``first-3``... that no live process holds, and its lock."""
    for slot in range(1, _MAX_COPIES + 1):
        dest = first if slot == 1 else first.with_name(f"{first.name}-{slot}")
        lock = open(_mkdir(dest.parent) / f".{dest.name}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return dest, lock
    raise errors.BadInput(f"{_MAX_COPIES} jobs hold working copies of {first.name}; is something stuck?")


def _copy(source: Path, commit: str, name: str, branch: str, cache: Path | None, **fields) -> SourceTree:
    key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    dest, claim = _claim((cache or cache_root()) / "checkouts" / f"{name}-{key}")
    try:
        if not (dest / ".git").is_dir():
            if dest.exists():
                shutil.rmtree(dest)
            clone_shared(source, dest)
        else:
            git(dest, "am", "--abort", check=False)
        base, dropped = prepare_working_copy(dest, commit, branch)
        git_out(dest, "clean", "-q", "-fd")
    except BaseException:
        claim.close()
        raise
    fields.setdefault("version", (dest / "version.txt").read_text().strip())
    return SourceTree(path=dest, base=base, branch=branch, has_tests=(dest / "tests").is_dir(), dropped_paths=dropped,
                      claim=claim, **fields)


def from_checkout(path: Path | str, series_name: str | None = None, cache: Path | None = None) -> SourceTree:
    """A working copy of the user's DeepSpeed checkout at HEAD, on zero3-sp-fix/<series>; their repo is only read."""
    root = work_tree_root(Path(path))
    if not (root / STAGE3).is_file():
        raise errors.NotACheckout(f"{root} is a git work tree but not a DeepSpeed checkout (no {STAGE3})")
    ensure_clean(root)
    head = git_out(root, "rev-parse", "HEAD").strip()
    version = git_out(root, "show", f"{head}:version.txt").strip()
    series_name = series_name or series_for_version(version).name
    return _copy(root, head, "checkout", f"zero3-sp-fix/{series_name}", cache, version=version, origin="checkout",
                 upstream_commit=head)


def grafted_entries(history: list[tuple[str, str, str]], release: list[tuple[str, str, str]],
                    paths: tuple[str, ...] = GRAFTED_PATHS) -> list[tuple[str, str, str]]:
    """(mode, blob, path) of the graft's tree: ``release``'s entries under ``paths``, ``history``'s elsewhere."""
    return sorted([e for e in history if e[2].split("/", 1)[0] not in paths] +
                  [e for e in release if e[2].split("/", 1)[0] in paths], key=lambda e: e[2])


def _tree_entries(repo: Path, commit: str) -> list[tuple[str, str, str]]:
    """(mode, object, path) of every entry of ``commit``'s tree."""
    records = filter(None, git_out(repo, "ls-tree", "-r", "-z", "--full-tree", commit).split("\0"))
    entries = (record.split("\t", 1) for record in records)  # "<mode> <type> <object>", the path
    return [(mode, sha, path) for meta, path in entries for mode, _, sha in [meta.split()]]


def build_graft(release: str, history: str, mirror: Path | None = None,
                cache: Path | None = None) -> tuple[Path, Graft]:
    """The repo holding the newest-upstream commit (made once, then cached) and what it is made of."""
    cache = cache or cache_root()
    mirror = mirror or mirror_path()
    if not mirror.exists():
        raise errors.BadInput(f"no DeepSpeed mirror at {mirror} (set DEEPSPEED_MIRROR): the newest-upstream tree "
                              "grafts the newest sdist onto its history")
    if git(mirror, "cat-file", "-e", f"{history}^{{commit}}", check=False).returncode != 0:
        raise errors.BadInput(f"{mirror} has no commit {history[:12]} (the lock's newest-upstream history)")
    lock = load_lock()
    archive = fetch_sdist(release, lock, cache)
    repo = cache / "newest-upstream" / f"deepspeed-{release}-on-{history[:12]}"
    tag = "refs/tags/newest-upstream"

    def build(staging: Path) -> None:
        clone_shared(mirror, staging)
        # The release's files as its sdist repo committed them: the build outputs the sdist ships left out.
        git_out(staging, "fetch", "-q", str(_sdist_repo(release, cache, lock)), "refs/tags/sdist")
        entries = grafted_entries(_tree_entries(staging, history), _tree_entries(staging, "FETCH_HEAD"))
        index_env = {**os.environ, "GIT_INDEX_FILE": str(staging.parent / "index")}
        git_out(staging, "update-index", "-z", "--add", "--index-info", env=index_env,
                input="".join(f"{mode} {sha}\t{path}\0" for mode, sha, path in entries))
        # The mirror lacks a few image blobs of history's tree: they are named, not needed.
        tree = git_out(staging, "write-tree", "--missing-ok", env=index_env).strip()
        # Frozen, byte for byte (the old module name too): patches/master's base-commit id depends on it.
        message = (f"DeepSpeed {release} (PyPI sdist) on master {history[:12]}\n\n"
                   f"{', '.join(GRAFTED_PATHS)}: from {archive.name} (sha256 {lock[release].sha256}).\n"
                   f"Everything else, tests/ and docs/ included: master {history}.\n"
                   "Made by zero3-sp-gradfix (patch_and_test.source.build_graft); not an upstream commit.\n")
        commit = git_out(staging, "commit-tree", tree, "-p", history, "-m", message,
                         env=os.environ | FIXED_IDENTITY).strip()
        git_out(staging, "update-ref", tag, commit)

    _build_once(repo, tag, build)
    commit = git_out(repo, "rev-parse", f"{tag}^{{commit}}").strip()
    date = git_out(repo, "log", "-1", "--format=%cs", history).strip()
    return repo, Graft(commit=commit, release=release, sdist_sha256=lock[release].sha256, history=history,
                       history_date=date)


NEWEST_UPSTREAM = "newest-upstream"  # the origin, and the base_ref of a series made on the graft


def from_newest_upstream(series_name: str = "master", cache: Path | None = None, mirror: Path | None = None,
                         branch: str | None = None) -> SourceTree:
    """A working copy of the lock's ``[newest-upstream]`` commit: today's master, so the pull-request series."""
    wanted = load_newest_upstream()
    repo, graft = build_graft(wanted.release, wanted.history, mirror, cache)
    branch = branch or f"zero3-sp-fix/{series_name}"
    return _copy(repo, graft.commit, f"newest-{graft.release}", branch, cache, origin=NEWEST_UPSTREAM,
                 upstream_commit=graft.commit, graft=graft, series_name=series_name)


def from_series_base(series: Series, mirror: Path | None = None, branch: str | None = None,
                     cache: Path | None = None) -> SourceTree:
    """A working copy of the commit ``series`` was made on: a commit of the mirror, or the newest-upstream graft."""
    if series.base_ref != NEWEST_UPSTREAM:
        return from_mirror(series.base_commit, mirror, branch, cache)
    tree = from_newest_upstream(series.name, cache, mirror, branch)
    if tree.upstream_commit != series.base_commit:
        tree.release()
        raise errors.BadInput(f"series {series.name} was made on {series.base_commit[:12]}, but the lock's "
                              f"newest-upstream tree is {tree.upstream_commit[:12]}: reroll it")
    return tree


def from_mirror(commit: str, mirror: Path | None = None, branch: str | None = None,
                cache: Path | None = None) -> SourceTree:
    """A working copy of a (possibly bare) DeepSpeed git mirror at ``commit`` (a tag, a branch, an id)."""
    mirror = mirror or mirror_path()
    if not mirror.exists():
        raise errors.BadInput(f"no DeepSpeed mirror at {mirror} (set DEEPSPEED_MIRROR)")
    resolved = git(mirror, "rev-parse", "-q", "--verify", f"{commit}^{{commit}}", check=False)
    if resolved.returncode != 0:
        raise errors.BadInput(f"{commit!r} is not a commit of {mirror}")
    sha = resolved.stdout.strip()
    return _copy(mirror, sha, f"mirror-{sha[:12]}", branch or f"zero3-sp-fix/{sha[:12]}", cache, origin="mirror",
                 upstream_commit=sha)
