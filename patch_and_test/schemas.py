"""``python -m patch_and_test.schemas``: the JSON schemas of every report (``patch_and_test.review.schemas``)."""

import sys

from patch_and_test.review.schemas import main

if __name__ == "__main__":
    sys.exit(main())
