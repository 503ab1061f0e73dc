"""The GPT engine: in-flight batching of ChatTTS decode steps over a preallocated KV cache.

One :class:`Engine` owns one ONNX Runtime GPT session (the fused step graph,
chattts_serving/export/fused.py) and runs a scheduling loop on its own thread. Each
iteration:

1. ends sequences whose client went away (cancelled: through :meth:`Engine.cancel` at once,
   through their sink within :data:`CANCEL_POLL_STEPS` iterations) or whose deadline passed,
   and frees their rows;
2. admits waiting sequences (:class:`~chattts_serving.engine.waiting.WaitingQueue`: highest
   priority first, then arrival order) while rows are free (batch-priority ones only into
   ``EngineConfig.batch_rows`` rows), prefills them together in one right-padded GPT call,
   samples their first token and copies each one's prompt KV into a free row
   (:class:`~chattts_serving.engine.kvbatch.KvBatch`);
3. runs one decode step for every running sequence in one batched GPT call, samples each
   row with its own sampler, and streams tokens to each sequence's sink.

Two kinds of sequence share the batch, the step graph and the KV layout (same GPT weights):
``mode="code"`` (speech codes: ChatTTS' ``_infer_code``) and ``mode="text"`` (ChatTTS'
refine-text stage, ``_refine_text``: prompt embedded with ``emb_text`` only, each new token
embedded with ``emb_text``, logits from the text head on the step's hidden output, end token
``[Ebreak]``). Only the per-row embedding of the new token and the head/sampler differ.

The KV cache (:class:`~chattts_serving.engine.gpt.KvCache`) is allocated once, ``max_batch_size``
rows of ``max_context_tokens`` positions per layer; each row's positions start at column 0
and the graph writes each new position in place (its past and present are one memory), so a
decode step copies no cache and nothing ever grows or is compacted: a sequence's KV is copied
once, when it joins. Rows of different lengths share a step (GroupQueryAttention takes each
row's length). The cache lives in host memory (numpy), or with IO binding on the CUDA
execution provider in device memory (cupy), where it stays: a decode step uploads only the
embeddings (B, 1, H) and row lengths and downloads logits and hidden. Nothing here imports
Triton: the Triton model binds a :class:`~chattts_serving.engine.sinks.TokenSink` to its
response sender. A sequence and its ids: :mod:`chattts_serving.engine.sequence`; the waiting
queue: :mod:`chattts_serving.engine.waiting`; the rows: :mod:`chattts_serving.engine.kvbatch`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .. import contract
from ..contract import TEXT_EOS_ID, SequenceMode, StopReason
from ..errors import ErrorKind, RequestError
from .gpt import Embeddings, GptStepRunner
from .kvbatch import KvBatch
from .request import InvalidSequence
from .sampling import sample_batch, sample_text_batch
from .sequence import Sequence
from .waiting import QueueFull, WaitingQueue

log = logging.getLogger(__name__)

DEADLINE_EXCEEDED = "deadline exceeded"
"""The error message of a sequence whose deadline passed (kind DEADLINE)."""

CANCEL_POLL_STEPS = 4
"""A running sequence's sink is asked :meth:`~chattts_serving.engine.sinks.TokenSink.cancelled`
once per this many engine iterations (staggered by when it joined), not at every step: on
Triton the question is a round trip to the server per sequence (its share of the engine
thread: docs/decode-speed.md, "Threads on two cores"). A cancel through :meth:`Engine.cancel`
(the BLS's cancel datagram) is seen at the next iteration."""


class EngineBusy(RequestError):
    """The engine's waiting queue is full; the sequence was not accepted (kind BUSY)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorKind.BUSY)


class EngineObserver(Protocol):
    """Receives the engine's per-step measurements (e.g. Prometheus metrics). Engine thread."""

    def step(self, batch_size: int, live: int, kv_tokens: int) -> None:
        """One decode step ran over ``batch_size`` rows; ``live`` sequences are waiting or
        running; ``kv_tokens`` = rows x KV width now resident."""

    def idle(self) -> None:
        """The batch became empty: no row holds a sequence (the KV cache stays allocated,
        :class:`~chattts_serving.engine.gpt.KvCache` is preallocated; only its rows are free)."""


class _NoObserver:
    def step(self, batch_size: int, live: int, kv_tokens: int) -> None:
        pass

    def idle(self) -> None:
        pass


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling knobs (from the deployment profile).

    max_batch_size: running sequences decoded together per step.
    max_waiting: requests queued for admission (the distinct ``request.request_id`` of the
        waiting sequences); beyond it :meth:`Engine.submit` raises :class:`EngineBusy`, except
        for a sequence whose request already has a live one (a request the entry admitted may
        start several at once: refine-text's segments, ChatTTS' groups of 4; the limit is on
        requests, which the entry already bounds).
    max_prefill_tokens: padded prompt tokens prefilled together in one call.
    max_context_tokens: prompt + generated tokens allowed per sequence (the model's
        position limit).
    waiting_heartbeat_s: a sequence submitted with ``acknowledge=True`` that waits for a row
        hears from the engine at least this often (seconds): an empty sink call, like its
        acknowledgement. The entry's stall watchdog (``entry.stall_timeout_s``) takes a stream
        without any response for that long as a dead engine; without the heartbeat a stream
        queued behind long sequences (minutes on a CPU) would look the same.
    batch_rows: rows that sequences of a priority below realtime (``priority > 0``) may hold at
        once; the other ``max_batch_size - batch_rows`` are kept for realtime ones, so that a
        realtime stream's first token never waits for long batch requests to end (rows are not
        taken back once given: no preemption). None: no limit.
    """

    max_batch_size: int = 16
    max_waiting: int = 64
    max_prefill_tokens: int = 1024
    max_context_tokens: int = 4096
    waiting_heartbeat_s: float = 5.0
    batch_rows: int | None = None


@dataclass
class EngineStats:
    """Counters since start: steps, prefills, tokens, how many rows each decode step had,
    sequences that joined the batch and how many of them took a row an earlier one had held."""

    decode_steps: int = 0
    prefill_calls: int = 0
    tokens: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    finished: int = 0
    cancelled: int = 0
    errors: int = 0
    joins: int = 0
    row_reuses: int = 0

    def snapshot(self) -> dict[str, object]:
        return {"decode_steps": self.decode_steps, "prefill_calls": self.prefill_calls,
                "tokens": self.tokens, "finished": self.finished, "cancelled": self.cancelled,
                "errors": self.errors, "joins": self.joins, "row_reuses": self.row_reuses,
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())}}


class Engine:
    """In-flight batching engine over the fused ``gpt_step.onnx``.

    Thread-safety: :meth:`submit`, :meth:`cancel`, :meth:`stats` and :meth:`live_count` may
    be called from any thread; everything else runs on the engine thread (or, in tests, the
    caller's, via :meth:`run_once`). ``clock``: monotonic seconds for deadlines and heartbeats
    (a sequence's ``deadline_s`` and ``answered_s`` are on it).
    """

    def __init__(self, runner: GptStepRunner, embeddings: Embeddings, config: EngineConfig,
                 observer: EngineObserver | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.observer: EngineObserver = observer or _NoObserver()
        self.emb = embeddings
        self.config = config
        self.clock = clock
        self._cv = threading.Condition()
        self._queue = WaitingQueue(config.max_waiting, clock)
        self._unacknowledged: list[Sequence] = []  # submitted with acknowledge=True, not yet answered
        self._batch: KvBatch[Sequence] = KvBatch(runner.new_cache(config.max_batch_size, config.max_context_tokens))
        self._used_rows: set[int] = set()  # rows some sequence has held (for the row_reuses count)
        self._stop = False
        self._thread: threading.Thread | None = None
        self.stats_data = EngineStats()
        self._stats_lock = threading.Lock()
        self._iteration = 0  # run_once calls so far (the clock of CANCEL_POLL_STEPS)

    # ---- public API ---------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue a sequence (its request's own rules were checked when it was made). Raises
        :class:`EngineBusy` when the waiting queue is full (unless a live sequence has the same
        non-empty ``request.request_id``) and :class:`~chattts_serving.engine.request.InvalidSequence` (a
        ValueError) when its prompt and ``max_new_tokens`` cannot fit the context or a
        text-mode sequence meets artifacts without the text head."""
        req = seq.request
        if req.mode == SequenceMode.TEXT and not self.emb.has_text_head:
            raise InvalidSequence("these artifacts have no text head for refine-text; re-run `make export`",
                                  param=contract.EN_MODE.name)
        if req.prompt_length + req.params.max_new_tokens > self.config.max_context_tokens:
            raise InvalidSequence(f"prompt ({req.prompt_length} tokens) + max_new_tokens "
                                  f"({req.params.max_new_tokens}) exceeds the context of "
                                  f"{self.config.max_context_tokens} tokens", param=contract.FE_INPUT_IDS.name)
        with self._cv:
            running = bool(req.request_id) and any(s.request.request_id == req.request_id and not s.done
                                                   for s in self._batch.running())
            try:
                self._queue.push(seq, request_live=running)
            except QueueFull as exc:
                raise EngineBusy(f"server busy: {exc}") from None
            if seq.acknowledge:
                self._unacknowledged.append(seq)
            self._cv.notify()

    def cancel(self, stream_id: str) -> bool:
        """Ask the engine to end the live sequence whose ``request.stream_id`` is ``stream_id``
        at its next step (it then gets a last ``tokens`` call with stop reason ``cancelled``).
        Returns False when no such sequence is live."""
        with self._cv:
            found = self._queue.cancel(stream_id)
            if not found:
                for s in self._batch.running():
                    if s.request.stream_id == stream_id and not s.done:
                        s.cancel_requested = found = True
                        break
            if found:
                self._cv.notify()
            return found

    def live_count(self) -> int:
        """Sequences waiting or running."""
        with self._cv:
            return len(self._queue) + sum(1 for s in self._batch.running() if not s.done)

    def running(self) -> list[Sequence]:
        """The sequences holding rows now, in row order (a snapshot)."""
        with self._cv:
            return self._batch.running()

    def stats(self) -> dict[str, object]:
        with self._stats_lock:
            snap = self.stats_data.snapshot()
        with self._cv:
            snap["waiting"] = len(self._queue)
            snap["running"] = sum(1 for s in self._batch.running() if not s.done)
        return snap

    def warm_up(self, batch_sizes: tuple[int, ...] = (1, 4, 16), prompt_tokens: int = 48,
                past_tokens: int = 96, text_head: bool = False) -> None:
        """Run the GPT step once per shape class before serving, so that the first requests do
        not pay ONNX Runtime's first-run allocations.
        ``text_head``: also load the refine-text head now (65 MB at H=768) instead of at the
        first text-mode sequence; RuntimeError when the artifacts lack it. Uses the batch's
        own cache rows while nothing runs (their contents are never read afterwards)."""
        h = self.emb.emb_text.shape[1]
        if text_head:
            self.emb.text_logits(np.zeros((1, h), np.float32))
        self.runner.prefill(np.zeros((1, prompt_tokens, h), np.float32), np.array([prompt_tokens]))
        cache = self._batch.cache
        past = min(past_tokens, cache.capacity - 1)
        for b in batch_sizes:
            b = min(b, self.config.max_batch_size)
            self.runner.decode(np.zeros((b, 1, h), np.float32), cache, np.full(b, past, np.int64))

    def start(self) -> None:
        """Start the scheduling thread."""
        self._thread = threading.Thread(target=self._loop, name="chattts-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread; sequences still live end with an error."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cv:
            leftovers = self._queue.drain() + [s for s in self._batch.running() if not s.done]
            for r in self._batch.occupied():
                self._batch.leave(r)
        for s in leftovers:
            self._fail(s, RequestError("server is shutting down", ErrorKind.INTERNAL))

    # ---- loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not len(self._queue) and not any(not s.done for s in self._batch.running()):
                    self._cv.wait()
                if self._stop:
                    return
            try:
                self.run_once()
            except Exception as exc:  # keep serving: fail what was in flight, not the engine
                log.exception("engine iteration failed")
                with self._cv:
                    victims = [s for s in self._batch.running() if not s.done]
                    for r in self._batch.occupied():
                        self._batch.leave(r)
                for s in victims:
                    self._fail(s, RequestError(f"engine step failed: {type(exc).__name__}", ErrorKind.INTERNAL))

    def run_once(self) -> None:
        """One scheduling iteration (ends, admissions + prefill, one decode step)."""
        now = self.clock()
        self._iteration += 1
        for s in self._batch.running():
            if s.done:
                continue
            if s.cancel_requested or self._sink_cancelled(s):
                self._cancelled(s)
            elif s.deadline_s is not None and now > s.deadline_s:
                self._fail(s, RequestError(DEADLINE_EXCEEDED, ErrorKind.DEADLINE))
        self._release_done()
        with self._cv:
            new, self._unacknowledged = self._unacknowledged, []
        for s in new:
            if not s.done:
                self._flush(s, None)
        self._heartbeat()
        with self._cv:
            gone = self._queue.sweep()
        self._end_waiting(gone)
        newcomers = self._admit()
        if newcomers:
            self._prefill(newcomers)
        if any(not s.done for s in self._batch.running()):
            self._decode()
        self._release_done()

    def _sink_cancelled(self, s: Sequence) -> bool:
        """Whether ``s``'s sink says its client cancelled, asked at most once per
        :data:`CANCEL_POLL_STEPS` iterations (False between)."""
        if self._iteration - s.cancel_polled < CANCEL_POLL_STEPS:
            return False
        s.cancel_polled = self._iteration
        return s.sink.cancelled()

    def _release_done(self) -> None:
        """Free the rows of ended sequences; tell the observer when the batch empties."""
        batch = self._batch
        ended = [r for r in batch.occupied() if batch.seqs[r].done]  # type: ignore[union-attr]
        if not ended:
            return
        with self._cv:
            for r in ended:
                batch.leave(r)
        if batch.span == 0:
            self.observer.idle()

    def _end_waiting(self, gone: list[Sequence]) -> None:
        """End sequences taken out of the queue (called without the lock: their sinks send)."""
        for seq in gone:
            if seq.cancel_requested:
                self._cancelled(seq)
            else:
                self._fail(seq, RequestError(f"{DEADLINE_EXCEEDED} while waiting for a slot", ErrorKind.DEADLINE))

    def _heartbeat(self) -> None:
        """An empty sink call to every acknowledged waiting sequence that has heard nothing for
        ``waiting_heartbeat_s`` (sent without the lock, as in :meth:`_admit`)."""
        with self._cv:
            due = self._queue.heartbeats_due(self.config.waiting_heartbeat_s)
        for s in due:
            if not s.done:
                self._flush(s, None)

    def _admit(self) -> list[Sequence]:
        """Take the next waiting sequences for the free rows, up to ``max_prefill_tokens``
        padded prompt tokens. Sinks are asked and answered only after the queue's lock is
        released: a sink may talk to Triton, which may be waiting for ``submit`` or
        ``cancel`` (both take the lock) on the model's execute thread."""
        with self._cv:
            running = self._batch.running()
            room = self._batch.free_rows()
            batch_room = (None if self.config.batch_rows is None else
                          self.config.batch_rows - sum(1 for s in running if s.request.priority > 0))
            decision = self._queue.admit(room, batch_room, self.config.max_prefill_tokens)
        self._end_waiting(decision.gone)
        admitted = []
        for seq in decision.admitted:
            seq.cancel_polled = self._iteration
            if seq.sink.cancelled():
                seq.cancel_requested = True
                self._end_waiting([seq])
            else:
                admitted.append(seq)
        return admitted

    def _prefill(self, seqs: list[Sequence]) -> None:
        """One right-padded prefill of ``seqs``; each samples its first token and, unless that
        ended it, takes a free row with its prompt KV."""
        reqs = [s.request for s in seqs]
        width = max(r.prompt_length for r in reqs)
        h = self.emb.emb_text.shape[1]
        embeds = np.zeros((len(seqs), width, h), np.float32)
        lengths = np.array([r.prompt_length for r in reqs], np.int64)
        for i, r in enumerate(reqs):
            embeds[i, :r.prompt_length] = self.emb.prompt(r.input_ids, r.spk_emb, r.prompt_codes)
        logits, hidden, cache = self.runner.prefill(embeds, lengths)
        with self._stats_lock:
            self.stats_data.prefill_calls += 1
        for s in seqs:
            s.length = s.request.prompt_length
        self._accept(seqs, self._sample(seqs, logits, hidden), hidden)
        for i, s in enumerate(seqs):
            if s.done:
                continue
            with self._cv:
                row = self._batch.join(s, cache, i, s.length)
            with self._stats_lock:
                self.stats_data.joins += 1
                self.stats_data.row_reuses += row in self._used_rows
            self._used_rows.add(row)

    def _decode(self) -> None:
        batch = self._batch
        span = batch.span
        seqs = batch.seqs[:span]
        embeds = self._step_embeds(seqs)[:, None, :].astype(np.float32)
        logits, hidden = self.runner.decode(embeds, batch.cache, batch.step_lengths())
        batch.advance()
        live_rows = [i for i, s in enumerate(seqs) if s is not None and not s.done]
        live = [seqs[i] for i in live_rows]
        for s in live:
            assert s is not None
            s.length += 1
        with self._stats_lock:
            self.stats_data.decode_steps += 1
            self.stats_data.batch_sizes[len(live_rows)] += 1
        self._accept(live, self._sample(live, logits[live_rows], hidden[live_rows]),  # type: ignore[arg-type]
                     hidden[live_rows])
        with self._cv:
            queued = len(self._queue) + sum(1 for s in batch.running() if not s.done)
        self.observer.step(len(live_rows), queued, batch.resident_tokens())

    def _step_embeds(self, seqs: list[Sequence | None]) -> np.ndarray:
        """Embeddings (B, H) of each row's previous token: the sum of the 4 code embeddings
        (code mode), the ``emb_text`` row of the text id (text mode), zeros' codes for free
        or ended rows (their output is discarded)."""
        codes_in = np.zeros((len(seqs), contract.NUM_VQ), np.int64)
        text_rows: list[int] = []
        text_ids: list[int] = []
        for i, s in enumerate(seqs):
            if s is None or s.done or s.last_codes is None:
                continue
            if s.request.mode == SequenceMode.TEXT:
                text_rows.append(i)
                text_ids.append(int(s.last_codes[0]))
            else:
                codes_in[i] = s.last_codes
        embeds = self.emb.codes(codes_in)
        if text_rows:
            embeds[text_rows] = self.emb.text(np.array(text_ids, np.int64))
        return embeds

    def _sample(self, seqs: list[Sequence], logits: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """One step's tokens (B, 4) int64 for rows ``seqs`` given the step's code logits
        (B, 4, 626) and hidden (B, H): code rows from their code heads; text rows from the
        text head on ``hidden``, the id repeated on the 4 columns."""
        out = np.zeros((len(seqs), contract.NUM_VQ), np.int64)
        text = [i for i, s in enumerate(seqs) if s.request.mode == SequenceMode.TEXT]
        code = [i for i, s in enumerate(seqs) if s.request.mode != SequenceMode.TEXT]
        if code:
            out[code] = sample_batch(logits[code], [seqs[i].sampler for i in code])
        if text:
            ids = sample_text_batch(self.emb.text_logits(hidden[text]), [seqs[i].sampler for i in text], TEXT_EOS_ID)
            out[text] = ids[:, None]
        return out

    def _accept(self, seqs: list[Sequence], codes: np.ndarray, hidden: np.ndarray) -> None:
        """Record one sampled step per sequence, stream it, and mark ends."""
        for i, s in enumerate(seqs):
            if s.done:
                continue
            c = codes[i]
            s.sampler.record(c)
            ended = c[0] == TEXT_EOS_ID if s.request.mode == SequenceMode.TEXT else (c == contract.EOS_CODE).any()
            if ended:
                self._finish(s, StopReason.EOS)
                continue
            s.generated += 1
            s.last_codes = c
            s.pending_codes.append(c.astype(np.int32))
            s.pending_hidden.append(hidden[i])
            with self._stats_lock:
                self.stats_data.tokens += 1
            if s.generated >= s.request.params.max_new_tokens:
                self._finish(s, StopReason.MAX_TOKENS)
            elif len(s.pending_codes) >= s.request.emit_tokens or s.at_emit_point():
                self._flush(s, None)

    def _flush(self, s: Sequence, reason: StopReason | None) -> None:
        h = self.emb.emb_text.shape[1]
        codes = np.stack(s.pending_codes) if s.pending_codes else np.zeros((0, contract.NUM_VQ), np.int32)
        hidden = np.stack(s.pending_hidden) if s.pending_hidden else np.zeros((0, h), np.float32)
        s.pending_codes, s.pending_hidden = [], []
        s.answered_s = self.clock()
        try:
            s.sink.tokens(codes, hidden.astype(np.float32, copy=False), reason)
        except Exception:  # a broken sink must not stop the other sequences
            log.exception("sink of %s failed; dropping the sequence", s.request.stream_id)
            s.done = True

    def _finish(self, s: Sequence, reason: StopReason) -> None:
        s.done = True
        with self._stats_lock:
            self.stats_data.finished += 1
        self._flush(s, reason)

    def _cancelled(self, s: Sequence) -> None:
        """End a cancelled sequence: it leaves its row when the iteration frees ended ones; its
        sink hears ``cancelled`` (a sink whose client is gone may fail to deliver that, which
        is fine)."""
        s.done = True
        with self._stats_lock:
            self.stats_data.cancelled += 1
        s.pending_codes, s.pending_hidden = [], []
        self._flush(s, StopReason.CANCELLED)

    def _fail(self, s: Sequence, exc: RequestError) -> None:
        s.done = True
        with self._stats_lock:
            self.stats_data.errors += 1
        try:
            s.sink.error(exc)
        except Exception:
            log.exception("error sink of %s failed", s.request.stream_id)
