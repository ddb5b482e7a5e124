"""The patch-and-test pipeline: get source -> apply series -> run checks -> verdict -> bundle.

Role packages on floors, imports one way (CONTRIBUTING.md, "Layout").
"""

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout: patches/, docs/, requirements/, repro/
