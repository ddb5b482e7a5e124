"""``python -m patch_and_test.bundle``: the maintainer review bundle (``patch_and_test.review.bundle``)."""

import sys

from patch_and_test.review.bundle import main

if __name__ == "__main__":
    sys.exit(main())
