"""``python -m patch_and_test.affected_job``: DeepSpeed's own tests before and after a series.

The code: ``patch_and_test.upstream.job``; ``--table`` re-renders docs/affected-tests.md from the kept runs
(``patch_and_test.review.pr``).
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        from patch_and_test.review.pr import write_affected_doc

        sys.exit(write_affected_doc())
    from patch_and_test.upstream.job import main

    sys.exit(main())
