"""The pinned versions of torch and the lint tools, from requirements/pins.txt (or any file of ``name==version``
lines, e.g. requirements/alst.txt; a range is an error). toxfile.py loads it by path: it imports only the stdlib.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

PINS_FILE = Path(__file__).resolve().parents[2] / "requirements" / "pins.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(path: Path = PINS_FILE) -> dict[str, str]:
    """{name: version} for every ``name==version`` line of the pins file (comments and blanks skipped)."""
    found: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"{path}:{number}: not a name==version pin: {raw!r}")
        if match[1].lower() in found:
            raise ValueError(f"{path}:{number}: {match[1]} is pinned twice")
        found[match[1].lower()] = match[2]
    return found


def version(name: str, path: Path = PINS_FILE) -> str:
    try:
        return pins(path)[name.lower()]
    except KeyError:
        raise KeyError(f"{name} is not pinned in {path}") from None


def torch_requirement(environ: Mapping[str, str] = os.environ, path: Path = PINS_FILE) -> str:
    """The torch the envs install: ``torch`` + ``$TORCH_SPEC`` where it is set, else the pin."""
    spec = environ.get("TORCH_SPEC", "").strip()
    return f"torch{spec}" if spec else f"torch=={version('torch', path)}"
