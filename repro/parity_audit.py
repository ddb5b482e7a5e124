#!/usr/bin/env python
"""Gradient-scale parity audit: every ZeRO configuration point against one plain-torch oracle.

The runnable script (``python repro/parity_audit.py --help``; the ranks of a local launch run it
too); the audit itself is the package repro/audit/ (``repro.audit.run``), see docs/parity-audit.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.audit.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
