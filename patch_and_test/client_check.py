"""``python -m patch_and_test.client_check``: the installed clients' sp loss recipes.

The code: ``patch_and_test.downstream.clients``.
"""

import sys

from patch_and_test.downstream.clients import main

if __name__ == "__main__":
    sys.exit(main())
