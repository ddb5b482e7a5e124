"""``python -m patch_and_test.downstream_census``: the census in docs/downstream-notice.md.

The code: ``patch_and_test.downstream.census``.
"""

import sys

from patch_and_test.downstream.census import main

if __name__ == "__main__":
    sys.exit(main())
