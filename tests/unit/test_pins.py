"""requirements/pins.txt is the one place torch's and the lint tools' versions are written."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

from patch_and_test.core import pins
from tests.conftest import ROOT, tracked_files

# Records of what ran (results, the docs' measured environments) and DeepSpeed's own files are not pins.
NOT_PINS = ("patches/", "docs/", "results/", "benchmarks/results/")
TEXT_SUFFIXES = {".py", ".ini", ".toml", ".txt", ".cfg", ".md", ".sh", ".yaml", ".yml", ""}


def _candidate_files() -> list[Path]:
    return [
        path for path in tracked_files() if path.suffix in TEXT_SUFFIXES and (
            rel := path.relative_to(ROOT).as_posix()) != "requirements/pins.txt" and not rel.startswith(NOT_PINS)
    ]


def copies(text: str, name: str, version: str) -> list[str]:
    """Lines of text that carry name's pinned version: the name and the version on one line."""
    pattern = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")
    exact = re.compile(rf"(?<![\w.]){re.escape(version)}(?![\w.])")
    return [line.strip() for line in text.splitlines() if pattern.search(line) and exact.search(line)]


def test_pins_file_has_every_pin_once():
    found = pins.pins()
    assert set(found) == {"torch", "ruff", "yapf", "flake8", "codespell"}, found
    assert all(re.fullmatch(r"\d+(\.\d+)+", v) for v in found.values()), found


def test_no_second_copy_of_a_pin():
    files = _candidate_files()
    assert any(p.name == "tox.ini" for p in files) and any(p.name == "noxfile.py" for p in files)
    found = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name, version in pins.pins().items():
            found += [f"{path.relative_to(ROOT)}: {line}" for line in copies(text, name, version)]
    assert not found, "a pin written outside requirements/pins.txt:\n" + "\n".join(found)


# The shapes the copies had before pins.txt (made-up versions: this file must not carry the real ones).
@pytest.mark.parametrize("line", [
    "deps = ruff==9.8.7", "    torch{env:TORCH_SPEC:==9.8.7}", 'TOOLS = {"yapf": "9.8.7", "flake8": "1.2.3"}',
    'session.install("codespell==9.8.7")', 'TORCH = "torch" + spec("==9.8.7")'
])
def test_copies_are_recognised(line):
    assert any(copies(line, name, "9.8.7") for name in ("ruff", "torch", "yapf", "codespell"))


def test_not_copies():
    # A measured fact about a torch release, another package's version, a longer version.
    assert not copies("torch 9.8's gloo path", "torch", "9.8.7")
    assert not copies("torchvision==9.8.7", "torch", "9.8.7")
    assert not copies("ruff==9.8.70", "ruff", "9.8.7")


def test_torch_requirement_follows_torch_spec():
    assert pins.torch_requirement({}) == f"torch=={pins.version('torch')}"
    assert pins.torch_requirement({"TORCH_SPEC": "==9.8.7"}) == "torch==9.8.7"


def test_readers_take_the_pins_file():
    from patch_and_test.tools import lint

    assert lint.TOOLS == {t: pins.version(t) for t in ("yapf", "flake8", "codespell")}
    tox = (ROOT / "tox.ini").read_text()
    assert tox.count("{torch_requirement}") == 2
    # every env that installs a pinned tool takes its version from the pins file
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(tox)
    tools = {"ruff", "yapf", "flake8", "codespell"}
    for section in ini.sections():
        deps = ini[section].get("deps", "").split()
        if tools & set(deps):
            assert "requirements/pins.txt" in deps and deps[deps.index("requirements/pins.txt") - 1] == "-c", section
    assert "pins.torch_requirement()" in (ROOT / "noxfile.py").read_text()


def test_pins_file_refuses_what_it_cannot_read(tmp_path):
    bad = tmp_path / "pins.txt"
    bad.write_text("torch>=2\n")
    with pytest.raises(ValueError, match="not a name==version pin"):
        pins.pins(bad)
    bad.write_text("ruff==1.0.0\nruff==1.0.1\n")
    with pytest.raises(ValueError, match="pinned twice"):
        pins.pins(bad)


def test_every_requirement_pin_is_written_in_one_file():
    """``name==version`` of the envs' requirements and the clients: one file each (requirements/*.txt, the
    driver's CLIENT_ENVS); tox, nox and pyproject read them there."""
    where: dict[str, set[str]] = {}
    files = [
        p for p in _candidate_files()
        if p.suffix in (".txt", ".ini", ".toml", ".py") and not p.relative_to(ROOT).as_posix().startswith("tests/")
    ]
    for path in files:
        for pin in re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*==\d[\w.]*)", path.read_text()):
            where.setdefault(pin.lower(), set()).add(path.relative_to(ROOT).as_posix())
    twice = {pin: sorted(found) for pin, found in where.items() if len(found) > 1}
    assert twice == {}


# DeepSpeed 0.19.8's own dependencies (its requirements/requirements.txt): what a training environment has.
DEEPSPEED_DEPENDENCIES = {
    "einops", "hjson", "msgpack", "ninja", "numpy", "packaging", "psutil", "py-cpuinfo", "pydantic", "torch", "tqdm"
}


def test_a_users_install_adds_pyyaml_and_nothing_else_to_deepspeeds_dependencies():
    from packaging.requirements import Requirement

    def names(path: Path) -> set[str]:
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
        return {Requirement(line).name.lower() for line in lines if line}

    assert names(ROOT / "requirements" / "package.txt") - DEEPSPEED_DEPENDENCIES == {"pyyaml", "tomli"}
    assert 'tomli>=2; python_version < "3.11"' in (ROOT / "requirements" / "package.txt").read_text()
    assert "jinja2" in names(ROOT / "requirements" / "maint.txt")  # the job, the bundle and docs render with it
