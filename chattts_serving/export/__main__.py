"""``python -m chattts_serving.export``: same as ``chattts-export``."""

import sys

from .cli import main

sys.exit(main())
