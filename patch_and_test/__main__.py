"""``python -m patch_and_test``: the ``zero3-sp`` command (``patch_and_test.cli``)."""

from patch_and_test.cli import main

raise SystemExit(main())
