"""``python -m patch_and_test.selftest``: the package's own tests against one DeepSpeed release.

The code: ``patch_and_test.tools.selftest``.
"""

import sys

from patch_and_test.tools.selftest import main

if __name__ == "__main__":
    sys.exit(main())
