"""``python -m patch_and_test.releases``: the fix on every release's PyPI sdist (``patch_and_test.tools.releases``)."""

import sys

from patch_and_test.tools.releases import main

if __name__ == "__main__":
    sys.exit(main())
