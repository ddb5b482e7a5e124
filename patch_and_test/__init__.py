"""The patch-and-test pipeline: get source -> apply series -> run checks -> verdict -> bundle.

Role packages, imports one way: ``core`` (1) <- ``upstream``, ``downstream``, ``tools`` (2) <- ``job``,
``doctor`` (3) <- ``review`` (4) <- the commands on top (5: ``python -m patch_and_test[.X]``).
"""

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout: patches/, docs/, requirements/, repro/
