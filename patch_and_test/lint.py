"""``python -m patch_and_test.lint``: DeepSpeed's pre-commit rules on the series (``patch_and_test.tools.lint``)."""

import sys

from patch_and_test.tools.lint import main

if __name__ == "__main__":
    sys.exit(main())
