"""``python -m chattts_serving.client``: the same as the ``chattts-client`` command."""

import sys

from .cli import main

sys.exit(main())
