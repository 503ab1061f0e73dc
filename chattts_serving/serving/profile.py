"""Deployment profiles: every serving knob, typed and validated, from ``profiles/<name>.toml``.

Unknown keys are errors (``extra="forbid"``), so a typo in a profile fails at render time
instead of being silently ignored.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # Triton 24.10's Python backend stub is Python 3.10
    import tomli as tomllib

from ..audio.chunking import ChunkSchedule
from ..audio.reference import DEFAULT_PROMPT_CACHE_ENTRIES, ReferenceLimits
from ..contract import KvPrecision, Precision, Segmentation, VocoderPath
from ..engine.scheduler import EngineConfig
from ..runtime import OrtOptions
from .resilience import DegradeThresholds

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"

STALL_HEARTBEATS = 3
"""``entry.stall_timeout_s`` is at least this many ``engine.waiting_heartbeat_s``: a stream
queued in the engine hears from it every heartbeat, so only a stream that missed 3 in a row
(the engine's process is gone) is taken for stalled."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineProfile(_Strict):
    """The GPT engine's knobs. ``io_binding``: keep the KV cache where a GPU execution provider
    computes (device memory with cupy on CUDA; every step binds the cache in place either way,
    see :class:`~chattts_serving.engine.gpt.GptStepRunner`). ``precision``:
    ``fp32``, or the ``fp16`` or ``int8`` GPT graph (``chattts-export --precision fp16|int8``;
    int8: ``chattts_serving/export/int8.py``, its accuracy in manifest.json), or ``auto``: int8
    where its measured accuracy meets the threshold, else fp32
    (:func:`~chattts_serving.runtime.resolve_precision`). ``kv_cache``: the KV cache's element
    type (:class:`~chattts_serving.contract.KvPrecision`): ``fp32`` as exported (the reference),
    ``fp16`` or ``int8`` (the graph's cache rewritten when it loads,
    :mod:`chattts_serving.engine.kvprecision`; their accuracy in manifest.json ``kv_cache``)."""

    max_batch_size: int = Field(ge=1, le=256)
    max_waiting: int = Field(ge=1)
    waiting_heartbeat_s: float = Field(default=5.0, gt=0)
    batch_rows: int | None = Field(default=None, ge=1)
    max_prefill_tokens: int = Field(ge=16)
    max_context_tokens: int = Field(ge=64, le=4096)
    max_new_tokens_cap: int = Field(ge=1, le=4096)
    intra_op_threads: int = Field(ge=0)
    allow_spinning: bool
    io_binding: bool = False
    precision: Precision = Precision.FP32
    kv_cache: KvPrecision = KvPrecision.FP32
    nice: int = Field(default=0, ge=0, le=19)
    """Niceness of the engine's process (every thread: decode loop, ONNX Runtime pool, stub),
    0..19. On a CPU host the decode loop is throughput work that can wait a moment, while the
    entry model's admission and refusals, the BLS and the vocoders are latency work; raising the
    engine's niceness keeps them from waiting behind it (docs/performance.md, "The engine's
    niceness")."""

    @model_validator(mode="after")
    def _kv_fits_graph(self) -> EngineProfile:
        if self.precision is Precision.FP16 and self.kv_cache is KvPrecision.INT8:
            raise ValueError("engine.kv_cache int8 needs a graph with an fp32 KV cache; the fp16 graph "
                             "(engine.precision fp16) keeps its cache in fp16")
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.max_batch_size, self.max_waiting, self.max_prefill_tokens,
                            self.max_context_tokens, self.waiting_heartbeat_s, self.batch_rows)


class VocoderProfile(_Strict):
    """The vocoder models' knobs; ``max_queue_size``: windows waiting in Triton's dynamic
    batcher before it refuses more (sized for every live stream's next window). ``precision``:
    ``fp32``, ``fp16``, ``int8`` (``chattts-export --precision int8``: ``contract.INT8_GRAPH_FILES``)
    or ``auto`` (int8 where measured accurate enough, as the engine's)."""

    instance_count: int = Field(ge=1)
    max_batch_size: int = Field(ge=1, le=256)
    max_queue_size: int = Field(ge=1)
    max_queue_delay_microseconds: int = Field(ge=0)
    intra_op_threads: int = Field(ge=0)
    allow_spinning: bool
    precision: Precision = Precision.FP32


class FrontendProfile(_Strict):
    """The text front end. ``max_text_chars`` per request (control tokens not counted);
    ``max_segment_chars``: longest sentence segment generated as one GPT sequence;
    ``merge_segment_chars``: shorter pieces are merged while together at most this long
    (:class:`~chattts_serving.text.segments.SegmentRules`); ``wetext``: WeTextProcessing reads
    the Chinese entity kinds the normalisation corpus shows it reading right
    (:data:`chattts_serving.text.normalize.LIBRARY_KINDS`); False: our rules alone;
    ``segmentation``: the default of the request's ``segmentation``
    (:class:`~chattts_serving.contract.Segmentation`)."""

    instance_count: int = Field(ge=1)
    max_text_chars: int = Field(ge=1)
    default_voice_seed: int = Field(ge=0)
    max_segment_chars: int = Field(ge=8)
    merge_segment_chars: int = Field(ge=0)
    wetext: bool = True
    segmentation: Segmentation = Segmentation.STREAMING


class StreamProfile(_Strict):
    """The streaming chunk schedule (:class:`~chattts_serving.audio.chunking.ChunkSchedule`).
    ``rate_planned_chunks``: chunks after the first are sized from the stream's measured token
    rate so that each is ready before the audio sent has played out (``growth`` until a rate
    is known, and for streams slower than real time); ``chunk_margin_s``: the audio a planned
    chunk keeps in hand; ``min_planned_chunk_tokens``: the smallest planned chunk (vocoder cost
    against gaps at rates barely above real time). ``growth_basis``: what ``growth`` multiplies,
    each chunk ("chunk") or the audio sent so far ("audio": gapless up to RTF 1 / growth with
    seams set by the request alone). ``carry_vocoder_state``: the vocoder keeps each stream's
    convolution state from window to window (no left context re-vocoded; false: the windowed
    mode, each window decoded alone; docs/decode-speed.md, "A vocoder that carries its state").
    ``slow_stream_growth``: chunk sizes grow this many times per chunk for a stream measured
    slower than real time (0: ``growth`` at any rate; docs/decode-speed.md, "Streams slower
    than real time"). ``lookahead_step_tokens``: after the first window the lookahead grows
    from ``first_lookahead_tokens`` by this many tokens per window to ``lookahead_tokens`` (0:
    at once; docs/decode-speed.md, "The start of a stream")."""

    first_chunk_tokens: int = Field(ge=1)
    growth: float = Field(ge=1.0)
    max_chunk_tokens: int = Field(ge=1)
    left_context_tokens: int = Field(ge=0)
    lookahead_tokens: int = Field(ge=1)
    crossfade_samples: int = Field(ge=0)
    emit_tokens: int = Field(ge=1)
    default_vocoder: VocoderPath
    first_lookahead_tokens: int = Field(ge=0)
    rate_planned_chunks: bool = False
    chunk_margin_s: float = Field(default=0.05, ge=0, le=5)
    min_planned_chunk_tokens: int = Field(default=2, ge=1)
    growth_basis: Literal["chunk", "audio"] = "chunk"
    carry_vocoder_state: bool = False
    slow_stream_growth: float = Field(default=0.0, ge=0.0)
    lookahead_step_tokens: int = Field(default=0, ge=0)

    def schedule(self) -> ChunkSchedule:
        """The profile's chunk schedule; with ``carry_vocoder_state`` the BLS door's vocoder
        carries each stream's convolution state instead of re-vocoding the left context
        (:meth:`~chattts_serving.audio.chunking.ChunkSchedule.with_carried_state`)."""
        return ChunkSchedule(self.first_chunk_tokens, self.growth, self.max_chunk_tokens,
                             self.left_context_tokens, self.lookahead_tokens, self.crossfade_samples,
                             self.first_lookahead_tokens, self.rate_planned_chunks, self.chunk_margin_s,
                             self.min_planned_chunk_tokens, self.growth_basis,
                             slow_growth=self.slow_stream_growth, lookahead_step=self.lookahead_step_tokens,
                             carried=self.carry_vocoder_state).validate()


class EntryProfile(_Strict):
    """The entry models' knobs: admission limit, Triton queue, priorities, instances, circuit
    breaker, the stall watchdog, how often live streams are polled for client cancels
    (``cancel_poll_interval_s``, and at most ``cancel_polls_per_s`` polls a second in all:
    :class:`~chattts_serving.serving.lifecycle.CancelWatcher`), the threads that send "busy"
    refusals, how long an accepted request waits for its burst's refusals to go out first
    (``admission_settle_s``, at most ``admission_max_wait_s``:
    :class:`~chattts_serving.serving.admission.RefusalsFirst`), and ``chattts_offline``'s
    requests at once (``offline_threads``: its admission limit; one instance) and tokens per
    engine batch. ``gate``: ``chattts`` is the C++ admission gate (``chattts_serving/gate/gate.cc``,
    built at server start with the host's C++ compiler), which refuses "busy" in the server
    process and forwards the rest to the Python entry model ``chattts_entry``; false: the
    Python entry model is ``chattts`` itself and refuses on its own (no compiler needed,
    slower refusals under load: docs/performance.md, "Where the busy time goes")."""

    gate: bool
    max_concurrent_streams: int = Field(ge=1)
    max_queue_size: int = Field(ge=1)
    priority_levels: int = Field(ge=1, le=8)
    default_priority_level: int = Field(ge=1)
    breaker_failures: int = Field(ge=1)
    breaker_cooldown_s: float = Field(gt=0)
    stall_timeout_s: float = Field(gt=0)
    cancel_poll_interval_s: float = Field(gt=0, le=1)
    cancel_polls_per_s: float = Field(gt=0)
    refusal_threads: int = Field(ge=1)
    admission_settle_s: float = Field(ge=0, le=0.1)
    admission_max_wait_s: float = Field(ge=0, le=1)
    offline_threads: int = Field(ge=1)
    offline_emit_tokens: int = Field(ge=1)


class EnsembleProfile(_Strict):
    """The ensemble door (``chattts_ensemble``): ``max_concurrent_streams`` live streams at
    once, counted by the GPT engine model (its ensemble-mode sequences), beyond which a request
    is refused "server busy" before generating anything. Optional in a profile file."""

    max_concurrent_streams: int = Field(default=16, ge=1)


class DegradeProfile(_Strict):
    """Thresholds of :class:`~chattts_serving.serving.resilience.Degrader`
    (:class:`~chattts_serving.serving.resilience.DegradeThresholds`) and how many times larger
    chunks are while degraded (``chunk_scale``). Degraded mode never caps a request's tokens:
    it changes how audio is made, not how much of the text is spoken."""

    live_high: int = Field(ge=1)
    live_low: int = Field(ge=0)
    queued_high: int = Field(ge=1)
    queued_low: int = Field(ge=0)
    ttfa_p95_high_s: float = Field(gt=0)
    ttfa_p95_low_s: float = Field(gt=0)
    window: int = Field(ge=1)
    min_samples: int = Field(ge=1)
    min_dwell_s: float = Field(ge=0)
    max_age_s: float = Field(gt=0)
    chunk_scale: int = Field(ge=1)

    def thresholds(self) -> DegradeThresholds:
        return DegradeThresholds(live_high=self.live_high, live_low=self.live_low,
                                 ttfa_p95_high_s=self.ttfa_p95_high_s, ttfa_p95_low_s=self.ttfa_p95_low_s,
                                 window=self.window, min_dwell_s=self.min_dwell_s, max_age_s=self.max_age_s,
                                 min_samples=self.min_samples, queued_high=self.queued_high,
                                 queued_low=self.queued_low)


class HealthProfile(_Strict):
    """Self-healing of ``chattts-serve --restart-on-failure`` (:class:`~chattts_serving.deploy.supervisor.Supervisor`)
    and the deep probe's deadline (:func:`~chattts_serving.deploy.probe.probe`).

    Every ``interval_s`` seconds the supervisor checks that every Python-backend stub process
    the server started is alive; every ``probe_every`` checks (0: never) it also runs the deep
    probe (live, ready, every model READY, a 2-token synthesis) with a deadline of
    ``probe_timeout_s`` seconds. ``failures`` consecutive failed checks restart the server; a
    server process that has exited is restarted at once. ``stop_on_stall``: a model that stops
    working (the admission gate's ping of its target, or an entry model's stall watchdog, sees
    nothing for ``entry.stall_timeout_s``) stops the server, so that it stops claiming
    readiness and its supervisor starts a fresh one.
    """

    interval_s: float = Field(gt=0)
    failures: int = Field(ge=1)
    probe_every: int = Field(ge=0)
    probe_timeout_s: float = Field(gt=0, le=3600)
    stop_on_stall: bool = True


_REF = ReferenceLimits()


class ReferenceProfile(_Strict):
    """Reference-recording voices (ChatTTS' ``spk_smp`` + ``txt_smp``): what a recording may be
    (:class:`~chattts_serving.audio.reference.ReferenceLimits`) and how many encoded recordings
    the front end's :class:`~chattts_serving.audio.reference.PromptCache` keeps;
    ``encoder_intra_op_threads``: ONNX Runtime threads of the DVAE encoder in the front-end
    model (CPU). Optional in a profile file: absent keys take these defaults."""

    min_recording_s: float = Field(default=_REF.min_s, gt=0)
    max_recording_s: float = Field(default=_REF.max_s, gt=0, le=60)
    min_sample_rate_hz: int = Field(default=_REF.min_rate_hz, ge=1000)
    max_sample_rate_hz: int = Field(default=_REF.max_rate_hz, le=768000)
    max_transcript_chars: int = Field(default=_REF.max_transcript_chars, ge=1)
    prompt_cache_entries: int = Field(default=DEFAULT_PROMPT_CACHE_ENTRIES, ge=1)
    encoder_intra_op_threads: int = Field(default=2, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> ReferenceProfile:
        if self.min_recording_s > self.max_recording_s or self.min_sample_rate_hz > self.max_sample_rate_hz:
            raise ValueError("reference: a minimum exceeds its maximum")
        return self

    def limits(self) -> ReferenceLimits:
        return ReferenceLimits(self.min_recording_s, self.max_recording_s, self.min_sample_rate_hz,
                               self.max_sample_rate_hz, self.max_transcript_chars)


class Profile(_Strict):
    """A deployment profile (see ``profiles/cpu.toml`` for every key and its unit)."""

    name: str
    instance_kind: Literal["KIND_CPU", "KIND_GPU"]
    gpu_ids: list[int]
    onnx_providers: list[str]
    engine: EngineProfile
    vocoder: VocoderProfile
    frontend: FrontendProfile
    stream: StreamProfile
    entry: EntryProfile
    degrade: DegradeProfile
    health: HealthProfile
    reference: ReferenceProfile = ReferenceProfile()
    ensemble: EnsembleProfile = EnsembleProfile()

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.instance_kind == "KIND_GPU" and not self.gpu_ids:
            raise ValueError("instance_kind KIND_GPU needs gpu_ids")
        if self.entry.default_priority_level > self.entry.priority_levels:
            raise ValueError("entry.default_priority_level exceeds entry.priority_levels")
        if self.entry.admission_settle_s > self.entry.admission_max_wait_s:
            raise ValueError("entry.admission_settle_s exceeds entry.admission_max_wait_s")
        if self.engine.batch_rows is not None and self.engine.batch_rows > self.engine.max_batch_size:
            raise ValueError("engine.batch_rows exceeds engine.max_batch_size")
        admitted = self.entry.max_concurrent_streams + self.entry.offline_threads
        if self.engine.max_waiting < admitted:
            # Else a request the entry admitted can be refused "busy" by the engine, in Python, late.
            raise ValueError(f"engine.max_waiting ({self.engine.max_waiting}) is below the {admitted} requests the "
                             "entry admits (max_concurrent_streams + offline_threads)")
        if self.entry.stall_timeout_s < STALL_HEARTBEATS * self.engine.waiting_heartbeat_s:
            raise ValueError(f"entry.stall_timeout_s must be at least {STALL_HEARTBEATS} x "
                             "engine.waiting_heartbeat_s (a queued stream is not a stalled one)")
        d = self.degrade
        if d.live_low >= d.live_high or d.queued_low >= d.queued_high or d.ttfa_p95_low_s > d.ttfa_p95_high_s:
            raise ValueError("degrade: the recover thresholds must be below the degrade thresholds")
        if d.min_samples > d.window:
            raise ValueError("degrade: min_samples exceeds window (the TTFA criterion could never count)")
        self.stream.schedule()
        if self.stream.carry_vocoder_state and self.vocoder.instance_count > 1:
            # A stream's windows must reach the instance that holds its state.
            raise ValueError("stream.carry_vocoder_state needs vocoder.instance_count = 1")
        return self

    def ort(self, stage: Literal["engine", "vocoder"]) -> OrtOptions:
        """ONNX Runtime options for a stage (IO binding for the engine only; the device is the
        first of ``gpu_ids``, 0 without)."""
        p = self.engine if stage == "engine" else self.vocoder
        io_binding = self.engine.io_binding if stage == "engine" else False
        device = self.gpu_ids[0] if self.gpu_ids else 0
        kv_cache = self.engine.kv_cache if stage == "engine" else KvPrecision.FP32
        return OrtOptions(p.intra_op_threads, p.allow_spinning, tuple(self.onnx_providers), io_binding,
                          p.precision, device, kv_cache)


class ProfileError(ValueError):
    """A profile that does not exist or does not validate (message names the problem)."""


def load_profile(name_or_path: str | Path) -> Profile:
    """Load ``profiles/<name>.toml`` or a TOML file path. Raises :class:`ProfileError`."""
    p = Path(name_or_path)
    if not p.suffix:
        p = PROFILES_DIR / f"{name_or_path}.toml"
    if not p.is_file():
        known = sorted(x.stem for x in PROFILES_DIR.glob("*.toml"))
        raise ProfileError(f"no profile {name_or_path!r} (known: {', '.join(known)})")
    try:
        return Profile.model_validate(tomllib.loads(p.read_text()))
    except (ValidationError, tomllib.TOMLDecodeError, ValueError) as exc:
        raise ProfileError(f"profile {p}: {exc}") from None


def profile_from_json(text: str) -> Profile:
    """The profile as the renderer wrote it into the model repository."""
    return Profile.model_validate_json(text)
