"""``python -m patch_and_test.downstream``: the real clients' sp loss code on DeepSpeed unpatched and patched."""

import sys

from patch_and_test.downstream.run import main

sys.exit(main())
