"""What a reviewer of the series checks by eye, checked mechanically against patches/series.toml.

Commit messages: short, with their trailers. Subjects and cover letters: the version and patch
count the manifest gives, the base it names, b4's change-id, and only series names and versions
that exist. Pure text, no git.
"""

from __future__ import annotations

import re

import pytest

from patch_and_test.core.series import load_manifest, parse_version

# master v6 says what happens with sp == 1, which cases the test adds and why (a maintainer's review): 25 lines
MAX_BODY_LINES = 25
ISSUE_LINK = "Link: https://github.com/deepspeedai/DeepSpeed/issues/8692"
SERIES_NAME = re.compile(r"\bv\d+\.\d+\.\d+-v\d+\.\d+\.\d+\b")
MANIFEST = load_manifest()
TRAILER = re.compile(r"^(Fixes|Link|Reported-by|Signed-off-by|Co-developed-by|Suggested-by): ")


def split_message(message: str) -> tuple[list[str], list[str]]:
    """(body lines, trailer lines) of a commit message without its subject."""
    lines = message.rstrip("\n").splitlines()
    trailers = [line for line in lines if TRAILER.match(line)]
    body = [line for line in lines if not TRAILER.match(line)]
    text = [i for i, line in enumerate(body) if line.strip()]  # without the blank lines around it
    return (body[text[0]:text[-1] + 1] if text else []), trailers


def message(text: str) -> tuple[str, list[str], list[str]]:
    """(subject, body lines, trailer lines) of a format-patch file."""
    subject = " ".join(re.search(r"^Subject: (.*(?:\n .*)*)", text, re.M)[1].split())
    after_headers = text.split("\n\n", 1)[1]
    return subject, *split_message(after_headers.split("\n---\n", 1)[0])


@pytest.mark.parametrize("series", MANIFEST.series, ids=lambda s: s.name)
def test_commit_messages_are_short_and_carry_their_trailers(series):
    for i, patch in enumerate(series.patches, start=1):
        subject, body, trailers = message(patch.path.read_text())
        assert subject.startswith(f"[PATCH v{series.version} {i}/{len(series.patches)}] "), (patch.file, subject)
        assert len(body) <= MAX_BODY_LINES, f"{patch.file}: {len(body)} body lines"
        assert ISSUE_LINK in trailers and any(t.startswith("Signed-off-by: ") for t in trailers), patch.file
        # Messages stand alone in git log: no "patch 1" or "this series".
        assert not re.search(r"\bpatch \d\b|\bthis series\b", "\n".join(body), re.I), patch.file
    _, _, fix_trailers = message(series.fix_patches[0].path.read_text())
    assert any(t.startswith("Fixes: ec029e7625ae ") for t in fix_trailers), series.name
    assert "Reported-by: alanhuangyoo (GitHub)" in fix_trailers, series.name


@pytest.mark.parametrize("series", MANIFEST.series, ids=lambda s: s.name)
def test_cover_letter_agrees_with_the_manifest(series):
    letter = series.cover_letter.read_text()
    n = len(series.patches)
    assert f"Subject: [PATCH v{series.version} 0/{n}] " in letter
    assert re.search(rf"^base-commit: {series.base_commit}\nchange-id: \S+\n", letter, re.M)
    # "k/N" references name patches that exist.
    blurb = letter.split("\n\n", 1)[1].split("Range-diff against")[0]
    for k, total in re.findall(r"(?<![\w/-])(\d)/(\d)\b", blurb):
        assert int(total) == n and 1 <= int(k) <= n, (series.name, f"{k}/{total}")
    if series.version > 1:
        assert f"Changes in v{series.version}:" in letter
        assert f"Range-diff against v{series.version - 1}:" in letter
    assert not list(series.directory.glob("range-diff-*")), "the range-diff lives in the cover letter only"
    assert not re.search(r"@@[A-Z_]+@@", letter), "a placeholder left in the cover letter"
    # Only series that exist, and their versions as the manifest says.
    names = {s.name for s in MANIFEST.series}
    for named in set(SERIES_NAME.findall(letter)):
        assert named in names, (series.name, named)
    for claimed in re.findall(r"the other backports are at v(\d+)", letter):
        others = {s.version for s in MANIFEST.series if s.name not in (series.name, "master")}
        assert others == {int(claimed)}, (series.name, claimed, others)
    for claimed in re.findall(r"\bmaster at v(\d+)", letter):
        assert MANIFEST.by_name("master").version == int(claimed), (series.name, claimed)
    # A backport names its base (a tag, master, or the newest-upstream tree for a release newer than master)
    # and what it serves.
    made_on = re.search(r"made on (?:the )?(v[\d.]+|master|newest-upstream)", letter)
    if series.name != "master":
        assert made_on and made_on[1] == series.base_ref, series.name
        span = re.search(r"^Subject: .*\((v[\d.]+)(?: to (v[\d.]+))? backport\)", letter, re.M)
        assert span and "-".join(filter(None, span.groups())) == series.name, series.name
        last = parse_version(span[2] or span[1])
        assert parse_version(span[1]) == series.min_version <= last < series.below_version


MAX_PR_BODY_LINES = 25  # a downstream patch's message is its pull request's body: squash-merge form


def test_patches_outside_the_series_are_pull_request_bodies_of_at_most_25_lines():
    root = MANIFEST.path.parent
    others = sorted(root.glob("alternatives/0*.patch")) + sorted(root.glob("downstream/*/0*.patch"))
    assert others
    for path in others:
        _, body, trailers = message(path.read_text())
        assert sum(1 for line in body if line.strip()) <= MAX_PR_BODY_LINES, path.name
        assert any(t.startswith("Signed-off-by: ") for t in trailers), path.name


def test_change_ids_are_one_per_series():
    ids = [re.search(r"^change-id: (\S+)$", s.cover_letter.read_text(), re.M)[1] for s in MANIFEST.series]
    assert len(set(ids)) == len(ids)


def test_every_series_credits_the_reporter_and_the_convention():
    for series in MANIFEST.series:
        letter = series.cover_letter.read_text()
        assert "@alanhuangyoo" in letter and "@Eliaaazzz" in letter and "#4530" in letter, series.name
