#!/usr/bin/env python
"""The training-level effect (docs/downstream-notice.md); the code is the package ``repro.training``."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.training.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
