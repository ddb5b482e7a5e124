"""``python -m patch_and_test.install``: install a DeepSpeed release or tree here (``patch_and_test.core.install``)."""

import sys

from patch_and_test.core.install import main

if __name__ == "__main__":
    sys.exit(main())
