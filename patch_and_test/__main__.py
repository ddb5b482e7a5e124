"""``python -m patch_and_test``: the ``zero3-sp`` command (``patch_and_test.cli``)."""

import sys

from patch_and_test.cli import main

sys.exit(main())
