"""``python -m patch_and_test.signoff``: re-sign a series with the sender's identity.

The code: ``patch_and_test.core.signoff``.
"""

import sys

from patch_and_test.core.signoff import main

if __name__ == "__main__":
    sys.exit(main())
