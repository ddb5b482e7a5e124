"""``python -m patch_and_test.downstream_table``: the downstream table in docs/.

The code: ``patch_and_test.downstream.table``.
"""

import sys

from patch_and_test.downstream.table import main

if __name__ == "__main__":
    sys.exit(main())
