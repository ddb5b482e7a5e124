"""The tiny Llama's cache keeps nothing half-built: what a killed build left is cleared by the next one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from repro.alst import tiny_llama

pytest.importorskip("transformers")


def test_a_half_built_entry_and_a_dead_builders_folder_are_replaced(tmp_path):
    folder = tmp_path / "tiny-llama" / "abc"
    folder.mkdir(parents=True)  # an entry without its files: "Unrecognized model" when loaded
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = folder.parent / f".abc.{dead}.x1y2"  # a killed builder's temporary folder
    stale.mkdir()
    mine = folder.parent / f".abc.{os.getpid()}.live"  # a live builder's: left alone
    mine.mkdir()
    assert tiny_llama.build(folder) == folder
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not stale.exists() and mine.exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [mine.name, "abc"]
