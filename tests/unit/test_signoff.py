"""Sign-off: the package's series carry a placeholder, and the sender re-signs copies (pure text, no git)."""

from __future__ import annotations

import re
import shutil

import pytest

from patch_and_test.core import errors
from patch_and_test.core import signoff
from patch_and_test.core.series import load_manifest

SENDER = ("Ada Lovelace", "ada@example.org")


def test_every_patch_is_signed_by_the_placeholder_not_by_an_identity_posing_as_a_person():
    manifest = load_manifest()
    downstream = sorted(manifest.path.parent.glob("downstream/*/0*.patch"))
    assert downstream
    for path in [*downstream, *(p for s in manifest.series for p in [s.cover_letter, *(x.path for x in s.patches)])]:
        text = path.read_text()
        authors = re.findall(r"^From: (.*(?:\n[ \t].*)*)$", text.split("\n\n", 1)[0], re.M)
        assert [" ".join(a.split()) for a in authors] == [signoff.placeholder()], path
        signers = set(re.findall(r"^Signed-off-by: (.+)$", text.split("\n---\n", 1)[0], re.M))
        assert signers <= {signoff.placeholder()}, (path, signers)
    for series in manifest.series:
        assert not signoff.sign_state(series.directory).ready, series.name


def test_resigned_copies_are_ready_to_send_and_differ_only_in_the_identity(tmp_path):
    series = load_manifest().by_name("master")
    written = signoff.resign(series.directory, tmp_path / "out", *SENDER)
    assert [p.name for p in written] == sorted(p.name for p in series.directory.glob("0*.patch"))
    state = signoff.sign_state(tmp_path / "out")
    assert state.ready and state.signers == ("Ada Lovelace <ada@example.org>", )
    for new in written:
        old = (series.directory / new.name).read_text()
        assert signoff.placeholder() not in new.read_text()
        back = new.read_text().replace("Ada Lovelace <ada@example.org>", signoff.placeholder())
        assert back.replace("\nAda Lovelace (", "\nYour Name (") == old, new.name
    assert "\nAda Lovelace (3):\n" in written[0].read_text()
    # the package's own series are untouched
    assert not signoff.sign_state(series.directory).ready


def test_resign_text_unfolds_a_folded_from_header():
    text = "From 0000 Mon Sep 17 00:00:00 2001\nFrom: Your Name\n <you@example.invalid>\nSubject: x\n\nbody\n" \
        "Signed-off-by: Your Name <you@example.invalid>\n---\n diff\n"
    out = signoff.resign_text(text, *SENDER, is_cover=False)
    assert "From: Ada Lovelace <ada@example.org>\nSubject: x\n" in out
    assert "Signed-off-by: Ada Lovelace <ada@example.org>\n" in out


@pytest.mark.parametrize("text", [
    "Ada", "ada@example.org", "Ada <nomail>", "Your Name <you@example.invalid>",
    "Ada Lovelace <ada@example.org> trailing", "Ada Lovelace <ada@example.invalid>", "Ada Lovelace <ada@lab.INVALID>"
])
def test_bad_identities_are_one_line_errors(text):
    with pytest.raises(errors.BadInput) as caught:
        signoff.parse_identity(text)
    assert "\n" not in str(caught.value) and caught.value.exit_code == errors.Exit.ERROR


def test_a_copy_with_a_sign_off_that_is_not_its_author_is_not_ready(tmp_path):
    out = tmp_path / "out"
    signoff.resign(load_manifest().by_name("master").directory, out, *SENDER)
    first = sorted(out.glob("0001-*.patch"))[0]
    first.write_text(first.read_text().replace("Signed-off-by: Ada Lovelace", "Signed-off-by: Someone Else"))
    state = signoff.sign_state(out)
    assert not state.ready and "0001-" in state.describe()


def test_main_exit_codes(tmp_path, capsys):
    series = load_manifest().by_name("master").directory
    assert signoff.main([str(series), "--check"]) == 1
    assert signoff.main([str(series), "--as", "Ada Lovelace <ada@example.org>", "--out", str(tmp_path / "o")]) == 0
    assert signoff.main([str(tmp_path / "o"), "--check"]) == 0
    assert signoff.main([str(tmp_path), "--as", "Ada Lovelace <ada@example.org>"]) == 2  # no patches there
    copy = tmp_path / "copy"
    shutil.copytree(series, copy)
    assert signoff.main([str(copy), "--as", "Ada Lovelace <ada@example.org>", "--out", str(copy)]) == 2
    assert "error:" in capsys.readouterr().err


def test_a_copy_signed_with_an_invalid_address_is_not_ready(tmp_path):
    out = tmp_path / "out"
    signoff.resign(load_manifest().by_name("master").directory, out, *SENDER)
    for path in out.glob("000[1-9]-*.patch"):
        path.write_text(path.read_text().replace("ada@example.org", "ada@example.invalid"))
    state = signoff.sign_state(out)
    assert not state.ready and ".invalid" in state.describe()
