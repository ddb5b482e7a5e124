#!/usr/bin/env python
"""``python -m repro.tiny_llama build DIR | hub-cache HF_HOME`` (docs/alst-recipe.md); code: ``repro.alst``."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.alst.tiny_llama import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
