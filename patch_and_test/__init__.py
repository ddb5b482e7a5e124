"""The patch-and-test pipeline: get source -> apply series -> run checks -> verdict -> bundle.

Role packages on floors, imports one way (CONTRIBUTING.md, "Layout").
"""

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout: patches/, docs/, requirements/, repro/
# patches/ and deepspeed-sdists.lock: the checkout's, else the copies an installed wheel carries inside the package
# (setup.py), so that the installed doctor names the series and its patches without a checkout.
DATA_ROOT = PACKAGE_ROOT if (PACKAGE_ROOT / "patches" / "series.toml").is_file() else Path(__file__).resolve().parent
