"""The Triton models: one class per model, each ``model_repository/<name>/1/model.py`` a few
lines that subclass it and set ``pb`` to ``triton_python_backend_utils``.

| model | class | module | decoupled |
|---|---|---|---|
| chattts_frontend | :class:`FrontendModel` | :mod:`.frontend` | no |
| chattts_gpt | :class:`EngineModel` | :mod:`.engine` | yes |
| chattts_vocoder, chattts_dvae_vocoder | :class:`VocoderModel` | :mod:`.vocoder` | no (dynamic batching) |
| chattts_ensemble_vocoder | :class:`EnsembleVocoderModel` | :mod:`.vocoder` | yes |
| chattts (chattts_entry behind the gate) | :class:`StreamingEntryModel` | :mod:`.entry` | yes |
| chattts_offline (chattts_offline_entry) | :class:`OfflineEntryModel` | :mod:`.entry` | no |

What they share is in :mod:`.base`; the Triton 2.51 workarounds they need are reached through
their hooks (:mod:`chattts_serving.triton.compat`). The logic lives below this layer: the
front end (:mod:`chattts_serving.text`), the engine (:mod:`chattts_serving.engine`), the
vocoders (:mod:`chattts_serving.audio`) and the entry service
(:mod:`chattts_serving.serving.entry`).

``chattts_ensemble`` is a Triton ensemble (no model.py): its steps are the front end (a whole
request: :meth:`FrontendModel.respond`), the engine in ensemble mode (:meth:`EngineModel.accept`),
and the ensemble's vocoder (:meth:`EnsembleVocoderModel.accept`).
"""

from .base import DecoupledModel, TritonModel, UnaryModel
from .engine import EngineModel, header_request_id
from .entry import EntryModel, OfflineEntryModel, ServerStopper, StreamingEntryModel
from .frontend import FrontendModel
from .vocoder import EnsembleVocoderModel, VocoderModel

__all__ = ["DecoupledModel", "EngineModel", "EnsembleVocoderModel", "EntryModel", "FrontendModel",
           "OfflineEntryModel", "ServerStopper", "StreamingEntryModel", "TritonModel", "UnaryModel",
           "VocoderModel", "header_request_id"]
