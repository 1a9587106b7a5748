"""``python3 -m conformance``: run the suite and print the report (see ``--help``)."""

import sys

from .report import main

sys.exit(main())
