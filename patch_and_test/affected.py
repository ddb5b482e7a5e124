"""``python -m patch_and_test.affected``: which DeepSpeed tests a series can reach.

The code: ``patch_and_test.upstream.affected``.
"""

import sys

from patch_and_test.upstream.affected import main

if __name__ == "__main__":
    sys.exit(main())
