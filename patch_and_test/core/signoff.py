"""``zero3-sp signoff``: re-sign a series with the sender's identity before it is sent.

DeepSpeed's DCO check wants every commit signed off by its author; the package's series carry a placeholder
author and ``Signed-off-by``, so whoever sends a series signs it, with the git identity they commit with::

    zero3-sp signoff patches/master                # -> dist/signed/master/
    zero3-sp signoff patches/master --as "Ada Lovelace <ada@example.org>" --out DIR
    zero3-sp signoff --check dist/signed/master    # ready to send?

It rewrites, in copies, each patch's ``From:`` and placeholder ``Signed-off-by:``, and the cover letter's
``From:`` and shortlog: ``git am`` of the copies gives the same trees. Exit codes: 0 written (or, with --check,
ready to send); 1 --check found the placeholder or a sign-off that is not its patch's author; 2 bad input
(no identity, the placeholder or any .invalid address given as one, a folder without patches).
"""

from __future__ import annotations

import argparse
import email
import email.policy
import email.utils
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import errors
from patch_and_test.core.gitrun import git

PLACEHOLDER = ("Your Name", "you@example.invalid")  # who the package's own series say signed them
FROM = re.compile(r"^From: .*(?:\n[ \t].*)*$", re.M)  # a From: header, folded over lines or not


@dataclass(frozen=True)
class SignState:
    """Who signed a series' patches off, and whether it is ready to send."""

    series: str  # the series folder's name
    signers: tuple[str, ...]  # "Name <email>", one per distinct sign-off
    problems: tuple[str, ...]  # one line each: the placeholder, or an author without their sign-off

    @property
    def ready(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        who = ", ".join(self.signers) or "nobody"
        return f"signed off by {who}: " + ("ready to send" if self.ready else "NOT ready to send: " +
                                           "; ".join(self.problems))


def placeholder() -> str:
    return f"{PLACEHOLDER[0]} <{PLACEHOLDER[1]}>"


def unusable_address(address: str) -> bool:
    """An address no DCO sign-off can carry: ``.invalid`` is reserved never to exist (RFC 2606), the
    placeholder's ``example.invalid`` included."""
    return address.rstrip(">").lower().rsplit("@", 1)[-1].rstrip(".").endswith(".invalid")


def parse_identity(text: str) -> tuple[str, str]:
    """``"Name <email>"`` -> (name, email); a one-line error for anything else, for the placeholder and for any
    ``.invalid`` address."""
    name, address = email.utils.parseaddr(text)
    if not name or "@" not in address or text.strip() != f"{name} <{address}>":
        raise errors.BadInput(f"{text!r} is not an identity of the form 'Full Name <email@address>'")
    if (name, address) == PLACEHOLDER:
        raise errors.BadInput(f"{text!r} is the package's placeholder: sign with your own identity")
    if unusable_address(address):
        raise errors.BadInput(f"{text!r}: {address} is an .invalid address, which cannot exist: sign with your own")
    return name, address


def git_identity(cwd: Path | None = None) -> tuple[str, str]:
    """The identity git commits with here (``user.name`` and ``user.email``)."""
    values = [git(cwd or Path.cwd(), "config", key, check=False).stdout.strip() for key in ("user.name", "user.email")]
    if not all(values):
        raise errors.BadInput("git has no user.name and user.email here: set them, or pass --as 'Name <email>'")
    return parse_identity(f"{values[0]} <{values[1]}>")


def patch_files(series_dir: Path) -> list[Path]:
    files = sorted(series_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))
    if not files:
        raise errors.BadInput(f"{series_dir}: no git format-patch files (0000-*.patch ...)")
    return files


def resign_text(text: str, name: str, address: str, is_cover: bool) -> str:
    """One patch file with the placeholder author and sign-off replaced by ``name <address>``. Pure."""
    old_name, old_address = PLACEHOLDER
    header_end = text.index("\n\n")
    headers = FROM.sub(f"From: {name} <{address}>", text[:header_end], count=1)
    body = text[header_end:]
    for key in ("Signed-off-by: ", "Author: "):  # the trailer, and the range-diff's metadata in a cover letter
        body = body.replace(f"{key}{old_name} <{old_address}>", f"{key}{name} <{address}>")
    if is_cover:
        # format-patch's shortlog: "Your Name (3):"
        body = re.sub(rf"^{re.escape(old_name)} \((\d+)\):$", lambda m: f"{name} ({m[1]}):", body, flags=re.M)
    return headers + body


def resign(series_dir: Path, out: Path, name: str, address: str) -> list[Path]:
    """Copies of the series in ``out``, signed by ``name <address>``; ``series_dir`` is not touched."""
    files = patch_files(series_dir)
    if out.resolve() == series_dir.resolve():
        raise errors.BadInput(f"--out is the series folder itself ({out}): the package's series stay unsigned")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in files:
        (out / path.name).write_text(resign_text(path.read_text(), name, address, path.name.startswith("0000-")))
    return [out / path.name for path in files]


def check_signoff(patch: Path) -> list[str]:
    """DeepSpeed's DCO check on one patch file: a Signed-off-by trailer with exactly its author's name and email;
    what is wrong, one line each (empty when it holds)."""
    message = email.message_from_bytes(patch.read_bytes(), policy=email.policy.default)
    author = message["From"]
    if author is None:
        return ["no From: header"]
    name, address = author.addresses[0].display_name, author.addresses[0].addr_spec
    body = message.get_content() if not message.is_multipart() else ""
    signers = re.findall(r"^Signed-off-by: (.+)$", body.split("\n---\n", 1)[0], re.M)
    if f"{name} <{address}>" in [s.strip() for s in signers]:
        return []
    if not signers:
        return [f"not signed off (author {name} <{address}>): git commit -s"]
    return [f"Signed-off-by {signers} does not match the author {name} <{address}>"]


def sign_state(series_dir: Path) -> SignState:
    """Whether every patch is signed off by its author, and by someone other than the placeholder."""
    signers, problems = [], []
    for path in patch_files(series_dir):
        if path.name.startswith("0000-"):
            continue
        text = path.read_text()
        found = re.findall(r"^Signed-off-by: (.+)$", text.split("\n---\n", 1)[0], re.M)
        signers += [s.strip() for s in found if s.strip() not in signers]
        if placeholder() in found:
            problems.append(f"{path.name}: the placeholder sign-off ({placeholder()}): run "
                            f"zero3-sp signoff {series_dir}")
        elif any(unusable_address(s.strip()) for s in found):
            problems.append(f"{path.name}: signed off with an .invalid address")
        else:
            problems += [f"{path.name}: {why}" for why in check_signoff(path)]
    return SignState(series_dir.name, tuple(signers), tuple(problems))


def main(argv: list[str] | None = None) -> int:
    parser = errors.CommandParser(prog="zero3-sp signoff", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("series", type=Path, help="a folder of git format-patch files, e.g. patches/master")
    parser.add_argument("--as", dest="identity", metavar="'NAME <EMAIL>'",
                        help="sign as this identity (default: git's user.name and user.email here)")
    parser.add_argument("--out", type=Path, default=None, help="where the signed copies go "
                        "(default: dist/signed/<series folder name>)")
    parser.add_argument("--check", action="store_true",
                        help="only say who signed the series off and whether it is ready to send (exit 0 or 1)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            state = sign_state(args.series)
            print(f"{args.series}: {state.describe()}")
            return 0 if state.ready else 1
        name, address = parse_identity(args.identity) if args.identity else git_identity()
        out = args.out or PACKAGE_ROOT / "dist" / "signed" / args.series.resolve().name
        written = resign(args.series, out, name, address)
    except errors.PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    state = sign_state(out)
    print(f"{len(written)} files in {out}: {state.describe()}")
    print(f"send with: git send-email {out}/*.patch   (or git am them onto a branch and open a pull request)")
    return 0 if state.ready else 1
