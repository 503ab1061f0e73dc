"""``python -m chattts_serving.bench``: see :mod:`chattts_serving.bench.run`."""

import sys

from .run import main

sys.exit(main())
