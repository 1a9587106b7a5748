"""``python -m conformance.engines``: the field report (see :mod:`conformance.engines.field`)."""

import sys

from .field import main

sys.exit(main())
