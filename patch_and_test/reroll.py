"""``python -m patch_and_test.reroll``: regenerate a series as its next version (``patch_and_test.tools.reroll``)."""

import sys

from patch_and_test.tools.reroll import main

if __name__ == "__main__":
    sys.exit(main())
