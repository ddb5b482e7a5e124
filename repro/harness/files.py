"""Reading TOML and writing JSON the one way the package does it (JSON atomically: a reader never sees half).

Standard library only (and tomli on Python 3.10): tox's plugin (toxfile.py) loads it by path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

TOMLDecodeError = tomllib.TOMLDecodeError


def load_toml(path: Path | str) -> dict[str, Any]:
    """The parsed file; raises FileNotFoundError and TOMLDecodeError like tomllib."""
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def write_json(path: Path | str, data: Any, indent: int | None = 2) -> None:
    """Write ``data`` as JSON (and a final newline) atomically; the parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str) + "\n")
    tmp.replace(path)


def relative_to(path: str | None, root: Path) -> str | None:
    """``path`` relative to ``root`` (valid wherever ``root`` is copied), or as given when not under it."""
    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return path
