"""`python -m layoutsearch.calibration MEASUREMENTS.csv`: the `layoutsearch-calibrate` command,
for an environment whose scripts folder is not on PATH."""

import sys

from layoutsearch.calibration.cli import main

sys.exit(main())
