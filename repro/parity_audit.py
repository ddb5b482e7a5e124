#!/usr/bin/env python
"""Gradient-scale parity audit: the runnable script (its ranks run it too); the audit is repro/audit/."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.audit.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
