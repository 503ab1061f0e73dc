"""The Triton models of the repository by name (the doors clients call and the models behind
them), the admission gate's backend and watch, and the metric names the models share."""

from __future__ import annotations

from typing import Final

from .enums import VocoderPath

# --- Triton model names ------------------------------------------------------------------
MODEL_STREAM: Final = "chattts"
"""Decoupled entry point: text in, audio chunks streamed out. With the admission gate on (the
default, profile ``[entry] gate``) it is the C++ gate (``chattts_serving/gate/gate.cc``), which
answers "server busy" itself and forwards the rest to :data:`MODEL_STREAM_ENTRY`; without it,
the Python BLS entry model under this name."""
MODEL_STREAM_ENTRY: Final = "chattts_entry"
"""The Python BLS entry model behind the gate (metrics and logs labelled ``model="chattts"``)."""
GATE_BACKEND: Final = "chattts_gate"
"""The gate's Triton backend name (``backends/chattts_gate/libtriton_chattts_gate.so``)."""
MODEL_OFFLINE: Final = "chattts_offline"
"""Non-decoupled entry point for HTTP ``/v2/models/chattts_offline/infer``: the whole utterance.
With the gate on it is a second instance of the C++ gate, in front of :data:`MODEL_OFFLINE_ENTRY`."""
MODEL_OFFLINE_ENTRY: Final = "chattts_offline_entry"
"""The Python offline entry model behind its gate (metrics and logs labelled ``model="chattts_offline"``)."""
GATED_MODELS: Final = {MODEL_STREAM: MODEL_STREAM_ENTRY, MODEL_OFFLINE: MODEL_OFFLINE_ENTRY}
"""Each public entry model and the Python model behind it when the gate is on."""
MODEL_ADMISSION: Final = "chattts_admission"
"""The admission watch (gate on only): a decoupled model of the gate's backend that answers a
request with one response at once, one more each time a door of :data:`ADMISSION_DOORS` fills
or stops being full (output :data:`ADM_FULL`) and the same again every
:data:`ADMISSION_HEARTBEAT_S` between changes, until the client cancels or a gate unloads
(then it ends with the final flag: subscribe again). The OpenAI gateway subscribes to it and
refuses "busy" itself while ``chattts`` is full."""
PING_PARAMETER: Final = "chattts_ping"
"""Request parameter (BOOL true) of a ping: a request to a Python model that sends final
responses from its own threads (the entry models, the GPT engine), answered at once by its
``execute`` with an empty final response and nothing else. A model pings itself to get an
``execute`` in which to send its queued final responses, and the admission gate pings its
target to tell a live model from a stuck one (docs/triton-workarounds.md, "final responses")."""
ADMISSION_DOORS: Final = (MODEL_STREAM, MODEL_OFFLINE)
"""The doors the admission watch reports on, in the order of :data:`ADM_FULL`'s elements."""
ADMISSION_HEARTBEAT_S: Final = 5.0
"""Between changes the admission watch repeats its report this often, in seconds: a subscriber
that hears nothing for a few of these stops trusting the last report (a dead connection, not a
quiet server)."""
MODEL_ENSEMBLE: Final = "chattts_ensemble"
"""The ensemble door: a Triton ``platform: "ensemble"`` model whose steps are
:data:`MODEL_FRONTEND` (the whole request: validated, one sentence segment -> prompt),
:data:`MODEL_ENGINE` (in ensemble mode: one response per vocoder window of the chunk schedule),
:data:`MODEL_ENSEMBLE_VOCODER`; it streams the same audio chunks as
:data:`MODEL_STREAM` for one sentence, without a Python entry model in the per-chunk path, and
refuses what only :data:`MODEL_STREAM` does (refine-text, several segments, reference
recordings: docs/ensemble.md)."""
MODEL_ENSEMBLE_VOCODER: Final = "chattts_ensemble_vocoder"
"""The ensemble's last step (decoupled, no Triton batching): vocodes each window the engine
sends, drops the engine's progress ticks, and tells the engine when the client has cancelled
(docs/triton-workarounds.md, "ensemble: cancels and errors")."""
MODEL_FRONTEND: Final = "chattts_frontend"
MODEL_ENGINE: Final = "chattts_gpt"
MODEL_VOCODER: Final = "chattts_vocoder"
"""hidden (T, H) -> Decoder -> Vocos -> waveform (ChatTTS' default path)."""
MODEL_VOCODER_CODES: Final = "chattts_dvae_vocoder"
"""codes (T, 4) -> DVAE -> Vocos -> waveform (about half the cost)."""
ALL_MODELS: Final = (MODEL_FRONTEND, MODEL_ENGINE, MODEL_VOCODER, MODEL_VOCODER_CODES, MODEL_STREAM,
                     MODEL_OFFLINE, MODEL_STREAM_ENTRY, MODEL_OFFLINE_ENTRY, MODEL_ADMISSION, MODEL_ENSEMBLE_VOCODER,
                     MODEL_ENSEMBLE)
"""Every model of the repository with the gate on (the default); without it, all but the
Python models behind the gates (:data:`GATED_MODELS`) and the admission watch (:func:`models`)."""


def models(gate: bool) -> tuple[str, ...]:
    """The repository's models, with or without the admission gate."""
    gate_only = (*GATED_MODELS.values(), MODEL_ADMISSION)
    return ALL_MODELS if gate else tuple(m for m in ALL_MODELS if m not in gate_only)

REJECTED_METRIC: Final = "tts_rejected_total"
REJECTED_HELP: Final = "Requests refused before any work, by reason"
"""The refusal counter (labels ``model``, ``reason``) and its help text: the entry models and
the admission gate register the same family, which Triton merges only when name and help agree
(deploy/render.py passes both to the gate)."""

ACTIVE_METRIC: Final = "tts_active_requests"
"""The gauge of accepted requests in flight per entry model (label ``model``): set by the entry
models, read by the drain before a stop (:mod:`chattts_serving.deploy.drain`)."""

VOCODER_PATHS: Final = {VocoderPath.HIDDEN: MODEL_VOCODER, VocoderPath.CODES: MODEL_VOCODER_CODES}
"""The vocoder model that serves each path."""

# --- metrics -------------------------------------------------------------------------------
LATENCY_BUCKETS_S: Final = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
"""Upper bounds, in seconds, of the latency histograms (time to first audio, request duration)
of the models and of the gateway: one set, so that their quantiles compare bucket for bucket."""
