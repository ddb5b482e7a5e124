#!/usr/bin/env python
"""What a gradient sp times larger does to the update (docs/downstream-notice.md); code: ``repro.alst``."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.alst.optimizer_effect import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
