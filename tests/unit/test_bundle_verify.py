"""bundle verify reads every report of the bundle back through its model: an edited report fails
with its file and the reason, even when the manifest was rewritten to match it.

The bundle is a copy of ``tests/fixtures/bundle`` (a trimmed real 0.14.5 gloo run), with the
GitHub form written without a mirror and a fresh manifest; no DeepSpeed, no ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patch_and_test.review import bundle as bundle_mod
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "bundle"
CELL = "results/patch-and-test-ds0.14.5-gloo"


@pytest.fixture
def bundle(tmp_path) -> Path:
    from patch_and_test.review import github_form
    from patch_and_test.core.series import load_manifest

    from patch_and_test.review.pr import write_pages

    b = tmp_path / "bundle"
    shutil.copytree(FIXTURE, b)
    write_pages(b)
    github_form.write(b, load_manifest().by_name("master"), None)  # no mirror: a note, no branch
    bundle_mod.write_manifest(b)
    return b


def _edit(b: Path, rel: str, change) -> None:
    path = b / rel
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    bundle_mod.write_manifest(b)  # the hashes match: only the report's own content can tell


def only_renders(problems: list[str]) -> bool:
    """PR.md and EVIDENCE.md cannot be rendered from a report that does not validate: each says so, once."""
    return sorted(p.split(":")[0]
                  for p in problems) == ["EVIDENCE.md", "PR.md"] and all("cannot be rendered from the results" in p
                                                                         for p in problems)


def test_the_fixture_bundle_verifies(bundle):
    assert bundle_mod.verify(bundle) == []


def test_a_verdict_whose_checks_contradict_its_outcome_fails(bundle):
    _edit(bundle, f"{CELL}/verdict.json", lambda d: d["after"][0].update(exit_code=1))
    problem, *renders = bundle_mod.verify(bundle)
    assert problem == (f"{CELL}/verdict.json: not a valid zero3-sp-gradfix/verdict/v1 report: "
                       "zero3-sp-gradfix/verdict/v1: stored outcome='fixed' but its rows give 'not-fixed'")
    assert only_renders(renders)


def test_a_verdict_with_an_unknown_key_fails(bundle):
    _edit(bundle, f"{CELL}/verdict.json", lambda d: d["steps"][0].update(note="added"))
    problem, *renders = bundle_mod.verify(bundle)
    assert only_renders(renders)
    assert problem.startswith(f"{CELL}/verdict.json: not a valid zero3-sp-gradfix/verdict/v1 report: steps.0.note: ")


def test_a_verdict_is_validated_even_without_its_schema_key(bundle):
    _edit(bundle, f"{CELL}/verdict.json", lambda d: d.pop("schema"))
    problem, *renders = bundle_mod.verify(bundle)
    assert only_renders(renders)
    assert problem.startswith(f"{CELL}/verdict.json: not a valid zero3-sp-gradfix/verdict/v1 report: ")
    assert "schema=None" in problem


def test_an_edited_hash_is_still_caught_first_hand(bundle):
    path = bundle / CELL / "verdict.json"
    data = json.loads(path.read_text())
    data["outcome"] = "not-fixed"
    path.write_text(json.dumps(data))  # the manifest left as it was
    problems = bundle_mod.verify(bundle)
    assert f"{CELL}/verdict.json: sha256 differs from {bundle_mod.MANIFEST}" in problems
    assert any(p.startswith(f"{CELL}/verdict.json: not a valid") for p in problems)


def test_a_downstream_report_with_an_unknown_key_fails(bundle):
    rel = "results/downstream/downstream-tf5.25/patched/downstream_clients.json"
    _edit(bundle, rel, lambda d: d.update(comment="looks fine"))
    problems = bundle_mod.verify(bundle)
    assert any(
        p.startswith(f"{rel}: not a valid zero3-sp-gradfix/downstream-clients-report/v1 report: ") and "comment" in p
        for p in problems), problems


def test_a_reproducer_row_whose_ok_flag_was_edited_fails(bundle):
    from patch_and_test.review.docs import MODELS, import_model

    try:
        import_model(MODELS["repro-report"])
    except (ImportError, AttributeError, TypeError) as err:
        pytest.skip(f"the reproducer's report model does not import yet: {err}")
    rel = f"{CELL}/before/zero3_sp_grad_scale.json"

    def flip(d):
        row = next(r for r in d["rows"] if r["path"] == "__avg_scatter_grads")
        row["ok"] = not row["ok"]

    _edit(bundle, rel, flip)
    problem, *renders = bundle_mod.verify(bundle)
    assert only_renders(renders)
    assert problem.startswith(f"{rel}: not a valid zero3-sp-gradfix/repro-report/v1 report: "), problem


@pytest.mark.parametrize("rel", [f"{CELL}/after/zero3_sp_grad_scale.json", f"{CELL}/verdict.json"])
def test_a_file_that_is_not_json_fails(bundle, rel):
    (bundle / rel).write_text("{half")
    problems = bundle_mod.verify(bundle)
    assert f"{rel}: sha256 differs from {bundle_mod.MANIFEST}" in problems
    assert any(p.startswith(f"{rel}: not JSON") for p in problems), problems


def test_a_kept_verdict_that_does_not_validate_is_not_reused(tmp_path):
    from patch_and_test.job.verdict import Verdict

    path = tmp_path / "verdict.json"
    shutil.copyfile(FIXTURE / CELL / "verdict.json", path)
    inputs = Verdict.load(path).inputs
    assert bundle_mod.reusable(path, inputs)
    data = json.loads(path.read_text())
    data["outcome"] = "not-fixed"
    path.write_text(json.dumps(data))
    assert not bundle_mod.reusable(path, inputs)


def test_a_pr_body_that_links_into_the_bundle_or_grows_past_25_lines_fails(bundle):
    pr = bundle / "PR.md"
    pr.write_text(pr.read_text().replace("Fixes #8692", "Fixes #8692 ([evidence](EVIDENCE.md))") +
                  "".join(f"line {i}\n" for i in range(30)))
    bundle_mod.write_manifest(bundle)
    problems = bundle_mod.verify(bundle)
    assert "PR.md: links EVIDENCE.md (a pull request's body cannot link into the bundle)" in problems
    assert any(p.startswith("PR.md: ") and "non-blank lines (at most 25)" in p for p in problems)


def test_an_evidence_link_to_a_file_the_bundle_lacks_fails(bundle):
    from patch_and_test.review.pr import local_links

    target = local_links((bundle / "EVIDENCE.md").read_text())[0]
    (bundle / target).unlink()
    bundle_mod.write_manifest(bundle)
    assert f"EVIDENCE.md: links {target}, which the bundle does not have" in bundle_mod.verify(bundle)


def test_a_bundle_signed_by_its_sender_matches_the_repositorys_series_but_for_the_identity(bundle):
    from patch_and_test.core import signoff

    shutil.rmtree(bundle / "patches")
    shutil.copytree(bundle_mod.PACKAGE_ROOT / "patches", bundle / "patches")
    for letter in sorted((bundle / "patches").glob("*/0000-cover-letter.patch")):
        signoff.resign(bundle_mod.PACKAGE_ROOT / "patches" / letter.parent.name, letter.parent, "Ada Lovelace",
                       "ada@example.org")
    bundle_mod.write_manifest(bundle)

    def patch_problems() -> list[str]:
        return [p for p in bundle_mod.verify(bundle, bundle_mod.PACKAGE_ROOT / "patches") if p.startswith("patches/")]

    assert bundle_mod.bundle_sender(bundle) == ("Ada Lovelace", "ada@example.org") and patch_problems() == []
    fix = sorted((bundle / "patches" / "master").glob("0001-*.patch"))[0]
    fix.write_text(fix.read_text().replace("divisor", "divider", 1))
    bundle_mod.write_manifest(bundle)  # the hashes match: only the comparison with the repository can tell
    assert patch_problems() == [f"patches/master/{fix.name}: differs from the repository's patches/"]


def test_sending_md_is_listed_and_verified_like_the_other_pages(bundle):
    """SENDING.md (open #8854 first, agree the release, the two commands) is the bundle's, re-rendered by verify."""
    text = (bundle / "SENDING.md").read_text()
    assert "#8854" in text and "`deepspeed < 0.20.2`" in text and "zero3-sp send --deepspeed-src" in text
    assert "DEEPSPEED_SRC=" in text and "tox -e patch-and-test" in text and "run --src" in text
    assert "SENDING.md" in (bundle / bundle_mod.MANIFEST).read_text()
    (bundle / "SENDING.md").write_text(text.replace("Open #8854 first", "Skip #8854"))
    bundle_mod.write_manifest(bundle)
    assert [p.split(":")[0] for p in bundle_mod.verify(bundle)] == ["SENDING.md"]
    (bundle / "SENDING.md").unlink()
    bundle_mod.write_manifest(bundle)
    assert bundle_mod.verify(bundle) == ["SENDING.md: missing"]
