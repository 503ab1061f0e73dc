"""The one source of truth for names, dtypes and audio geometry.

Every Triton model, the clients, the load tests and the tests import their tensor names,
dtypes, model names and audio constants from here, so that the server and its users cannot
drift apart. Nothing in this package imports Triton, torch or onnxruntime.

Audio geometry (ChatTTS 0.2.5, ``ChatTTS/config/config.py`` and ``vocos`` head config):
one GPT step emits one token = 4 codes; the Decoder/DVAE upsample each token to 2 mel frames;
Vocos' iSTFT has a hop of 256 samples, so one token is 512 samples of 24 kHz mono audio,
46.875 tokens per second of audio.

Each name is defined once, in the submodule of its topic, and read from here
(``contract.SAMPLE_RATE_HZ``: every public name of a submodule is the package's too):
:mod:`.enums` (the enumerations), :mod:`.units` (audio geometry, code and text vocabularies),
:mod:`.doors` (model names, the gate and the watch, shared metric names), :mod:`.specs` (how
tensors and request parameters are described, and the parameters), :mod:`.tensors` (every
model's tensors), :mod:`.graphs` (exported graphs and their tensor names).
"""

from __future__ import annotations

from .doors import *  # noqa: F403
from .enums import *  # noqa: F403
from .graphs import *  # noqa: F403
from .specs import *  # noqa: F403
from .tensors import *  # noqa: F403
from .units import *  # noqa: F403
