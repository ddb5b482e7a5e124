import sys

from patch_and_test.doctor.cli import main

sys.exit(main())
