"""PR.md assembly: an included document's headings nest under the PR's own sections."""

from patch_and_test.pr import _demote_headings


def test_headings_go_one_level_down_but_code_blocks_stay():
    doc = "## What changes\ntext\n```bash\n# a shell comment\n```\n### Detail\n#hashtag"
    assert _demote_headings(doc).splitlines() == [
        "### What changes", "text", "```bash", "# a shell comment", "```", "#### Detail", "#hashtag"]
