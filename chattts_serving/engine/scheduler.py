"""The GPT engine: in-flight batching of ChatTTS decode steps with a resident KV cache.

One :class:`Engine` owns one ONNX Runtime GPT session and runs a scheduling loop on its own
thread. Each iteration:

1. drops sequences whose client went away (cancelled) or whose deadline passed;
2. admits waiting sequences (highest priority first, then arrival order) while the batch
   has room (batch-priority ones only into ``EngineConfig.batch_rows`` rows), and prefills
   them together in one padded GPT call, sampling their first token;
3. places each newcomer into the row of a finished sequence (copying only its own prompt KV)
   or, when none fits, compacts the batch in one rebuild of the KV buffers (rows
   right-aligned, left padding masked out);
4. runs one decode step for every running sequence in one batched GPT call, samples each
   row with its own sampler, and streams tokens to each sequence's sink.

Two kinds of sequence share the batch, the step graph and the KV layout (same GPT weights):
``mode="code"`` (speech codes: ChatTTS' ``_infer_code``) and ``mode="text"`` (ChatTTS'
refine-text stage, ``_refine_text``: prompt embedded with ``emb_text`` only, each new token
embedded with ``emb_text``, logits from the text head on the step's hidden output, end token
``[Ebreak]``). Only the per-row embedding of the new token and the head/sampler differ.

The KV cache lives in per-layer buffers of the engine, (rows, heads, capacity, head_dim),
rows right-aligned and advancing together: each step the graph reads the buffers (unused
columns masked) and returns only the new position's keys and values, which are written into
the next column in place; the buffers grow by ``KV_GROWTH`` columns when full. The mask has
one more column than the buffers, always 1: the new position of the next step, so that it is
passed to the graph as it is. KV buffers and mask are arrays of the runner's
:class:`~chattts_serving.engine.arrays.ArrayBackend`: numpy on the host, or (IO binding on the CUDA
execution provider) cupy in device memory, where they stay: a decode step uploads only the
embeddings (B, 1, H) and downloads logits and hidden (:meth:`GptStepRunner.step`). Nothing here
imports Triton: the Triton model binds a :class:`TokenSink` to its response sender.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .. import contract
from ..contract import TEXT_EOS_ID, SequenceMode, StopReason
from ..errors import ErrorKind, RequestError
from ..params import SamplingParams
from .gpt import Embeddings, GptStepRunner
from .sampling import RequestSampler, sample_batch, sample_text_batch

log = logging.getLogger(__name__)

KV_TRIM = 64
"""Compact the batch when this many leading KV columns are padding for every live row. Rows
advance together, so with newcomers taking finished rows the batch never empties and its
width would otherwise grow without bound (found by a 30-minute soak: memory and step time
kept rising)."""

KV_GROWTH = 16
"""Columns added to the KV buffers when full: one copy per 16 steps, and on average 8 masked
columns of wasted attention (64 spare columns cost more in attention reads than the copies).
"""




DEADLINE_EXCEEDED = "deadline exceeded"
"""The error message of a sequence whose deadline passed (kind DEADLINE)."""


class EngineBusy(RequestError):
    """The engine's waiting queue is full; the sequence was not accepted (kind BUSY)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorKind.BUSY)


class TokenSink(Protocol):
    """Where a sequence's output goes. Called from the engine thread only."""

    def tokens(self, codes: np.ndarray, hidden: np.ndarray, stop_reason: StopReason | None) -> None:
        """New tokens: codes (N, 4) int32, hidden (N, H) float32; ``stop_reason`` is None while
        the sequence runs and set on its last call (EOS, MAX_TOKENS or CANCELLED).
        For a text-mode sequence each row of ``codes`` holds the new text token id (in
        [0, 21178)) in all 4 columns (ChatTTS' ``inputs_ids`` layout in text mode); take
        column 0."""

    def error(self, exc: RequestError) -> None:
        """The sequence ended with an error (DEADLINE when its deadline passed, INTERNAL for a
        failure); no further calls follow."""

    def cancelled(self) -> bool:
        """True once the client no longer wants output."""


class EngineObserver(Protocol):
    """Receives the engine's per-step measurements (e.g. Prometheus metrics). Engine thread."""

    def step(self, batch_size: int, live: int, kv_tokens: int) -> None:
        """One decode step ran over ``batch_size`` rows; ``live`` sequences are waiting or
        running; ``kv_tokens`` = rows x KV width now resident."""

    def idle(self) -> None:
        """The batch became empty (nothing running, KV cache released)."""


class _NoObserver:
    def step(self, batch_size: int, live: int, kv_tokens: int) -> None:
        pass

    def idle(self) -> None:
        pass


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling knobs (from the deployment profile).

    max_batch_size: running sequences decoded together per step.
    max_waiting: requests queued for admission (the distinct ``Sequence.owner`` of the
        waiting sequences); beyond it :meth:`Engine.submit` raises :class:`EngineBusy`, except
        for a sequence whose ``owner`` already has a live one (a request the entry admitted may
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


@dataclass(eq=False)
class Sequence:
    """One request inside the engine.

    prompt_ids: (T,) int prompt token ids; spk_emb: (H,) float32 normalised speaker vector or
    None; emit_tokens: tokens per sink call; priority: lower runs first (0 = realtime);
    deadline_s: ``time.monotonic()`` after which the sequence is dropped with an error;
    mode: ``"code"`` (speech codes) or ``"text"`` (refine text: prompt from
    :func:`chattts_serving.text.refine.refine_prompt_ids`, no speaker vector, params from
    :meth:`chattts_serving.text.refine.RefineParams.sampling_params`); acknowledge: the engine
    thread's first sink call for the sequence is an empty one (no tokens, stop reason ''),
    made as soon as it sees the submission (a BLS caller returns from its call at the first
    response and can then watch its client; every response is sent from the engine thread);
    prompt_codes: (P, 4) int audio-prompt codes in [0, 625) placed after the text prompt and
    embedded as the sum of the 4 code embeddings (ChatTTS' ``spk_smp``, see
    :mod:`chattts_serving.audio.reference`), code mode only; None (default) for none;
    request_id: names the sequence (:meth:`Engine.cancel`); owner: the request it belongs to
    (in the server the entry's request id, shared by a request's sequences; "" for none), see
    ``EngineConfig.max_waiting``.
    """

    prompt_ids: np.ndarray
    spk_emb: np.ndarray | None
    params: SamplingParams
    sink: TokenSink
    emit_tokens: int = 1
    first_emit_tokens: int = 0  # also flush when exactly this many tokens exist (the first chunk's need)
    priority: int = 0
    deadline_s: float | None = None
    request_id: str = ""
    owner: str = ""
    mode: SequenceMode = SequenceMode.CODE
    acknowledge: bool = False
    prompt_codes: np.ndarray | None = None
    sampler: RequestSampler = field(init=False)
    length: int = 0  # tokens in this sequence's KV cache
    generated: int = 0
    last_codes: np.ndarray | None = None
    pending_codes: list[np.ndarray] = field(default_factory=list)
    pending_hidden: list[np.ndarray] = field(default_factory=list)
    done: bool = False
    submitted_s: float = field(default_factory=time.monotonic)
    answered_s: float = 0.0  # time.monotonic() of the last sink call (0: none yet)
    prefill_kv: list[np.ndarray] | None = None  # this row's prefill KV until it joins the batch
    prefill_width: int = 0
    cancel_requested: bool = False

    def __post_init__(self) -> None:
        self.sampler = RequestSampler(self.params)

    @property
    def prompt_length(self) -> int:
        """Prompt positions: text ids plus audio-prompt codes."""
        return int(self.prompt_ids.size) + (0 if self.prompt_codes is None else len(self.prompt_codes))


@dataclass
class EngineStats:
    """Counters since start: steps, prefills, tokens, and how many rows each decode step had."""

    decode_steps: int = 0
    prefill_calls: int = 0
    tokens: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    finished: int = 0
    cancelled: int = 0
    errors: int = 0
    rebuilds: int = 0
    row_reuses: int = 0

    def snapshot(self) -> dict[str, object]:
        return {"decode_steps": self.decode_steps, "prefill_calls": self.prefill_calls,
                "tokens": self.tokens, "finished": self.finished, "cancelled": self.cancelled,
                "errors": self.errors, "rebuilds": self.rebuilds, "row_reuses": self.row_reuses,
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())}}


class Engine:
    """In-flight batching engine over ``gpt_step.onnx``.

    Thread-safety: :meth:`submit`, :meth:`stats` and :meth:`live_count` may be called from
    any thread; everything else runs on the engine thread (or, in tests, the caller's, via
    :meth:`run_once`).
    """

    def __init__(self, runner: GptStepRunner, embeddings: Embeddings, config: EngineConfig,
                 observer: EngineObserver | None = None) -> None:
        self.runner = runner
        self.observer: EngineObserver = observer or _NoObserver()
        self.emb = embeddings
        self.config = config
        self._cv = threading.Condition()
        self._waiting: list[tuple[int, int, Sequence]] = []  # heap of (priority, order, seq)
        self._unacknowledged: list[Sequence] = []  # submitted with acknowledge=True, not yet answered
        self._order = itertools.count()
        self._running: list[Sequence] = []
        self._xp = runner.backend
        self._kv: list[Any] = []  # per layer K, V: (rows, heads, capacity, head_dim) runner.kv_dtype
        self._mask: Any = self._xp.zeros((0, 1), np.int64)  # (rows, capacity + 1); >= _width unused, last 1
        self._width = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self.stats_data = EngineStats()
        self._stats_lock = threading.Lock()

    # ---- public API ---------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue a sequence. Raises :class:`EngineBusy` when the waiting queue is full (unless
        a live sequence has the same non-empty ``owner``) and
        ValueError when its prompt is empty or cannot fit the context, its mode is unknown,
        a text-mode sequence has a speaker vector or audio-prompt codes or the artifacts lack
        the text head, or audio-prompt codes are not (P, 4) in [0, 625)."""
        if seq.prompt_ids.size == 0:
            raise ValueError("empty prompt")
        if seq.prompt_codes is not None:
            pc = seq.prompt_codes
            if seq.mode != SequenceMode.CODE:
                raise ValueError("only a code-mode sequence takes audio-prompt codes")
            if pc.ndim != 2 or pc.shape[1] != contract.NUM_VQ or (
                    pc.size and (pc.min() < 0 or pc.max() >= contract.EOS_CODE)):
                raise ValueError(f"audio-prompt codes must be (P, {contract.NUM_VQ}) in [0, {contract.EOS_CODE})")
        if seq.mode not in tuple(SequenceMode):
            raise ValueError(f"unknown sequence mode {seq.mode!r}; expected one of {[m.value for m in SequenceMode]}")
        if seq.mode == SequenceMode.TEXT:
            if seq.spk_emb is not None:
                raise ValueError("a text-mode (refine) sequence takes no speaker vector")
            if not self.emb.has_text_head:
                raise ValueError("these artifacts have no text head for refine-text; re-run `make export`")
        if seq.prompt_length + seq.params.max_new_tokens > self.config.max_context_tokens:
            raise ValueError(f"prompt ({seq.prompt_length} tokens) + max_new_tokens "
                             f"({seq.params.max_new_tokens}) exceeds the context of "
                             f"{self.config.max_context_tokens} tokens")
        with self._cv:
            if not self._has_owner(seq.owner) and (queued := self._waiting_requests()) >= self.config.max_waiting:
                raise EngineBusy(f"server busy: {queued} requests already waiting")
            heapq.heappush(self._waiting, (seq.priority, next(self._order), seq))
            if seq.acknowledge:
                self._unacknowledged.append(seq)
            self._cv.notify()

    def _waiting_requests(self) -> int:
        """Requests with a sequence in the queue: distinct owners, each sequence without one a
        request of its own. Called with the lock held."""
        owners = {q[2].owner for q in self._waiting if q[2].owner}
        return len(owners) + sum(1 for q in self._waiting if not q[2].owner)

    def _has_owner(self, owner: str) -> bool:
        """A live sequence (waiting or running) has this ``owner`` (never for ""). Called with
        the lock held."""
        return bool(owner) and any(
            s.owner == owner and not s.done for s in [q[2] for q in self._waiting] + self._running)

    def cancel(self, request_id: str) -> bool:
        """Ask the engine to end the live sequence ``request_id`` at its next step (it then
        gets a last ``tokens`` call with stop reason ``cancelled``). Returns False when no
        such sequence is live."""
        with self._cv:
            for s in [q[2] for q in self._waiting] + self._running:
                if s.request_id == request_id and not s.done:
                    s.cancel_requested = True
                    self._cv.notify()
                    return True
        return False

    def live_count(self) -> int:
        """Sequences waiting or running."""
        with self._cv:
            return len(self._waiting) + sum(1 for s in self._running if not s.done)

    def stats(self) -> dict[str, object]:
        with self._stats_lock:
            snap = self.stats_data.snapshot()
        with self._cv:
            snap["waiting"] = len(self._waiting)
            snap["running"] = sum(1 for s in self._running if not s.done)
        return snap

    def warm_up(self, batch_sizes: tuple[int, ...] = (1, 4, 16), prompt_tokens: int = 48,
                past_tokens: int = 96, text_head: bool = False) -> None:
        """Run the GPT step once per shape class before serving, so that the first requests do
        not pay ONNX Runtime's first-run allocations (about 1 s on the full model here).
        ``text_head``: also load the refine-text head now (65 MB at H=768) instead of at the
        first text-mode sequence; RuntimeError when the artifacts lack it."""
        h = self.emb.emb_text.shape[1]
        xp = self._xp
        if text_head:
            self.emb.text_logits(np.zeros((1, h), np.float32))
        self.runner.step(np.zeros((1, prompt_tokens, h), np.float32),
                         xp.to_device(np.ones((1, prompt_tokens), np.int64)), self.runner.empty_past(1))
        heads, hd = self.runner.art.num_heads, self.runner.art.head_dim
        for b in batch_sizes:
            b = min(b, self.config.max_batch_size)
            past = [xp.zeros((b, heads, past_tokens, hd), self.runner.kv_dtype) for _ in range(2 * self.runner.layers)]
            self.runner.step(np.zeros((b, 1, h), np.float32), xp.to_device(np.ones((b, past_tokens + 1), np.int64)),
                             past)

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
            leftovers = [s for _, _, s in self._waiting] + [s for s in self._running if not s.done]
            self._waiting.clear()
            self._running = []
        for s in leftovers:
            self._fail(s, RequestError("server is shutting down", ErrorKind.INTERNAL))

    # ---- loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not any(not s.done for s in self._running):
                    self._cv.wait()
                if self._stop:
                    return
            try:
                self.run_once()
            except Exception as exc:  # keep serving: fail what was in flight, not the engine
                log.exception("engine iteration failed")
                with self._cv:
                    victims = [s for s in self._running if not s.done]
                    self._running = []
                    self._release_kv()
                for s in victims:
                    self._fail(s, RequestError(f"engine step failed: {type(exc).__name__}", ErrorKind.INTERNAL))

    def run_once(self) -> None:
        """One scheduling iteration (admit + prefill, rebuild, one decode step)."""
        now = time.monotonic()
        for s in self._running:
            if s.done:
                continue
            if s.cancel_requested or s.sink.cancelled():
                self._cancelled(s)
            elif s.deadline_s is not None and now > s.deadline_s:
                self._fail(s, RequestError(DEADLINE_EXCEEDED, ErrorKind.DEADLINE))
        with self._cv:
            new, self._unacknowledged = self._unacknowledged, []
        for s in new:
            if not s.done:
                self._flush(s, None)
        self._heartbeat(now)
        self._sweep_waiting(now)
        newcomers = self._admit()
        if newcomers:
            self._prefill(newcomers)
        self._place([s for s in newcomers if not s.done])
        if any(not s.done for s in self._running):
            self._decode()
        if self._running and all(s.done for s in self._running):
            self._rebuild([])  # the batch emptied: release its KV cache now
        elif self._running and self._width - max(s.length for s in self._running if not s.done) >= KV_TRIM:
            self._trim()

    def _place(self, newcomers: list[Sequence]) -> None:
        """Put newcomers into the batch. A finished row stays in the batch as a dead row (its
        mask ignored, its output discarded) until a newcomer takes its slot: then only the
        newcomer's KV is copied into that row, O(prompt) instead of rebuilding the whole batch
        cache, O(batch x width) (measured: the full copy cost about one decode step per join at
        batch 16). The batch is compacted by a full rebuild only when a newcomer does not fit
        (no dead row, or a prompt longer than the batch width), when more than half the rows
        are dead, or when every row is dead (then the cache is released)."""
        rows = self._running
        dead = [i for i, s in enumerate(rows) if s.done]
        width = self._width
        leftover = []
        for s in newcomers:
            if dead and s.length <= width:
                self._fill_row(dead.pop(), s)
            else:
                leftover.append(s)
        if leftover or len(dead) * 2 > len(rows) or (rows and len(dead) == len(rows)):
            self._rebuild(leftover)

    def _release_kv(self) -> None:
        """Drop the KV buffers (the batch is empty)."""
        self._kv, self._mask, self._width = [], self._xp.zeros((0, 1), np.int64), 0

    def _fill_row(self, r: int, s: Sequence) -> None:
        """Copy newcomer ``s``'s prefill KV right-aligned into dead row ``r``."""
        assert s.prefill_kv is not None
        width, n, pw = self._width, s.length, s.prefill_width
        self._mask[r, :-1] = 0
        self._mask[r, width - n:width] = 1
        for j, src in enumerate(s.prefill_kv):
            self._kv[j][r, :, width - n:width] = src[0, :, pw - n:pw]
        s.prefill_kv = None
        with self._cv:
            self._running[r] = s
        with self._stats_lock:
            self.stats_data.row_reuses += 1

    @staticmethod
    def _expired_or_named(seq: Sequence, now: float) -> bool:
        """A waiting sequence that :meth:`cancel` named or whose deadline passed."""
        return seq.cancel_requested or (seq.deadline_s is not None and now > seq.deadline_s)

    def _end_waiting(self, gone: list[Sequence]) -> None:
        """End sequences taken out of the queue (called without the lock: their sinks send)."""
        for seq in gone:
            if seq.cancel_requested:
                self._cancelled(seq)
            else:
                self._fail(seq, RequestError(f"{DEADLINE_EXCEEDED} while waiting for a slot", ErrorKind.DEADLINE))

    def _heartbeat(self, now: float) -> None:
        """An empty sink call to every acknowledged waiting sequence that has heard nothing for
        ``waiting_heartbeat_s`` (sent without the lock, as in :meth:`_admit`)."""
        period = self.config.waiting_heartbeat_s
        with self._cv:
            due = [q[2] for q in self._waiting
                   if q[2].acknowledge and q[2].answered_s and now - q[2].answered_s >= period]
        for s in due:
            if not s.done:
                self._flush(s, None)

    def _sweep_waiting(self, now: float) -> None:
        """Drop waiting sequences that :meth:`cancel` named or whose deadline passed, also
        while the batch is full (``_admit`` only looks at the queue's head when a slot is
        free). Their sinks are not asked here (in Triton that is a round trip per sequence
        and step); ``_admit`` asks when a slot frees."""
        keep: list[tuple[int, int, Sequence]] = []
        gone: list[Sequence] = []
        with self._cv:
            for q in self._waiting:
                if self._expired_or_named(q[2], now):
                    gone.append(q[2])
                else:
                    keep.append(q)
            if not gone:
                return
            self._waiting = keep
            heapq.heapify(self._waiting)
        self._end_waiting(gone)

    def _admit(self) -> list[Sequence]:
        """Take the next waiting sequences for the free rows, up to ``max_prefill_tokens``
        padded prompt tokens. Sinks are asked and answered only after the queue's lock is
        released: a sink may talk to Triton, which may be waiting for ``submit`` or
        ``cancel`` (both take the lock) on the model's execute thread."""
        now = time.monotonic()
        out: list[Sequence] = []
        gone: list[Sequence] = []
        with self._cv:
            room = self.config.max_batch_size - sum(1 for s in self._running if not s.done)
            batch_room = (room if self.config.batch_rows is None else
                          self.config.batch_rows - sum(1 for s in self._running if not s.done and s.priority > 0))
            while self._waiting and len(out) < room:
                seq = self._waiting[0][2]
                if self._expired_or_named(seq, now):
                    gone.append(heapq.heappop(self._waiting)[2])
                    continue
                if seq.priority > 0 and batch_room <= 0:
                    break  # the queue is in priority order: only batch sequences are left
                width = max([s.prompt_length for s in out] + [seq.prompt_length])
                if out and width * (len(out) + 1) > self.config.max_prefill_tokens:
                    break
                out.append(heapq.heappop(self._waiting)[2])
                if seq.priority > 0:
                    batch_room -= 1
        self._end_waiting(gone)
        admitted = []
        for seq in out:
            if seq.sink.cancelled():
                seq.cancel_requested = True
                self._end_waiting([seq])
            else:
                admitted.append(seq)
        return admitted

    def _prefill(self, seqs: list[Sequence]) -> None:
        width = max(s.prompt_length for s in seqs)
        h = self.emb.emb_text.shape[1]
        embeds = np.zeros((len(seqs), width, h), np.float32)
        mask = np.zeros((len(seqs), width), np.int64)
        for i, s in enumerate(seqs):
            n = s.prompt_length
            embeds[i, width - n:] = self.emb.prompt(s.prompt_ids, s.spk_emb, s.prompt_codes)
            mask[i, width - n:] = 1
        logits, hidden, present = self.runner.step(embeds, self._xp.to_device(mask), self.runner.empty_past(len(seqs)))
        with self._stats_lock:
            self.stats_data.prefill_calls += 1
        for i, s in enumerate(seqs):
            s.length = s.prompt_length
            s.prefill_kv = [p[i:i + 1] for p in present]
            s.prefill_width = width
        self._accept(seqs, self._sample(seqs, logits, hidden), hidden)

    def _rebuild(self, newcomers: list[Sequence]) -> None:
        """New KV buffers from surviving rows and newcomers; rows right-aligned to a common
        width equal to the longest sequence, with ``KV_GROWTH`` spare columns."""
        old_rows = {id(s): i for i, s in enumerate(self._running)}
        old_width = self._width
        keep = [s for s in self._running if not s.done] + newcomers
        with self._cv:
            self._running = keep
        with self._stats_lock:
            self.stats_data.rebuilds += 1
        if not keep:
            self._release_kv()
            self.observer.idle()
            return
        width = max(s.length for s in keep)
        cap = width + KV_GROWTH
        n_layers2 = 2 * self.runner.layers
        heads, hd = self.runner.art.num_heads, self.runner.art.head_dim
        kv = [self._xp.zeros((len(keep), heads, cap, hd), self.runner.kv_dtype) for _ in range(n_layers2)]
        mask = np.zeros((len(keep), cap + 1), np.int64)
        mask[:, -1] = 1
        for r, s in enumerate(keep):
            n = s.length
            mask[r, width - n:width] = 1
            if id(s) in old_rows:
                src_row, src, src_w = old_rows[id(s)], self._kv, old_width
            else:
                assert s.prefill_kv is not None
                src_row, src, src_w = 0, s.prefill_kv, s.prefill_width
            for j in range(n_layers2):
                kv[j][r, :, width - n:width] = src[j][src_row, :, src_w - n:src_w]
            s.prefill_kv = None
        self._kv, self._mask, self._width = kv, self._xp.to_device(mask), width

    def _trim(self) -> None:
        """Drop the leading KV columns that are padding for every live row (one copy). Rows,
        dead ones included, keep their places, so newcomers can still take finished rows."""
        keep = max(s.length for s in self._running if not s.done)
        start = self._width - keep
        rows, heads, _, hd = self._kv[0].shape
        trimmed = []
        for buf in self._kv:
            t = self._xp.zeros((rows, heads, keep + KV_GROWTH, hd), self.runner.kv_dtype)
            t[:, :, :keep] = buf[:, :, start:self._width]
            trimmed.append(t)
        mask = self._xp.zeros((rows, keep + KV_GROWTH + 1), np.int64)
        mask[:, :keep] = self._mask[:, start:self._width]
        mask[:, -1] = 1
        self._kv, self._mask, self._width = trimmed, mask, keep
        with self._stats_lock:
            self.stats_data.rebuilds += 1

    def _grow(self) -> None:
        """Add ``KV_GROWTH`` columns to the full KV buffers (one copy)."""
        rows, heads, cap, hd = self._kv[0].shape
        grown = []
        for buf in self._kv:
            g = self._xp.zeros((rows, heads, cap + KV_GROWTH, hd), self.runner.kv_dtype)
            g[:, :, :cap] = buf
            grown.append(g)
        mask = self._xp.zeros((rows, cap + KV_GROWTH + 1), np.int64)
        mask[:, :cap] = self._mask[:, :cap]
        mask[:, -1] = 1
        self._kv, self._mask = grown, mask

    def _decode(self) -> None:
        seqs = self._running
        if self._width >= self._kv[0].shape[2]:
            self._grow()
        embeds = self._step_embeds(seqs)[:, None, :].astype(np.float32)
        # The mask's last column (always 1) is this step's new position: passed as it is.
        logits, hidden, new_kv = self.runner.step(embeds, self._mask, self._kv, reuse_outputs=True)
        w = self._width
        for buf, new in zip(self._kv, new_kv):
            buf[:, :, w] = new[:, :, 0]
        self._mask[:, w] = 1
        self._width = w + 1
        live_rows = [i for i, s in enumerate(seqs) if not s.done]
        for i in live_rows:
            seqs[i].length += 1
        with self._stats_lock:
            self.stats_data.decode_steps += 1
            self.stats_data.batch_sizes[len(live_rows)] += 1
        live = [seqs[i] for i in live_rows]
        self._accept(live, self._sample(live, logits[live_rows], hidden[live_rows]), hidden[live_rows])
        with self._cv:
            queued = len(self._waiting) + sum(1 for s in self._running if not s.done)
        self.observer.step(len(live_rows), queued, int(len(seqs) * self._width))

    def _step_embeds(self, seqs: list[Sequence]) -> np.ndarray:
        """Embeddings (B, H) of each row's previous token: the sum of the 4 code embeddings
        (code mode), the ``emb_text`` row of the text id (text mode), zeros' codes for dead
        rows (their output is discarded)."""
        codes_in = np.zeros((len(seqs), contract.NUM_VQ), np.int64)
        text_rows: list[int] = []
        text_ids: list[int] = []
        for i, s in enumerate(seqs):
            if s.done or s.last_codes is None:
                continue
            if s.mode == SequenceMode.TEXT:
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
        text = [i for i, s in enumerate(seqs) if s.mode == SequenceMode.TEXT]
        code = [i for i, s in enumerate(seqs) if s.mode != SequenceMode.TEXT]
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
            ended = c[0] == TEXT_EOS_ID if s.mode == SequenceMode.TEXT else (c == contract.EOS_CODE).any()
            if ended:
                self._finish(s, StopReason.EOS)
                continue
            s.generated += 1
            s.last_codes = c
            s.pending_codes.append(c.astype(np.int32))
            s.pending_hidden.append(hidden[i])
            with self._stats_lock:
                self.stats_data.tokens += 1
            if s.generated >= s.params.max_new_tokens:
                self._finish(s, StopReason.MAX_TOKENS)
            elif len(s.pending_codes) >= s.emit_tokens or s.generated == s.first_emit_tokens:
                self._flush(s, None)

    def _flush(self, s: Sequence, reason: StopReason | None) -> None:
        h = self.emb.emb_text.shape[1]
        codes = np.stack(s.pending_codes) if s.pending_codes else np.zeros((0, contract.NUM_VQ), np.int32)
        hidden = np.stack(s.pending_hidden) if s.pending_hidden else np.zeros((0, h), np.float32)
        s.pending_codes, s.pending_hidden = [], []
        s.answered_s = time.monotonic()
        try:
            s.sink.tokens(codes, hidden.astype(np.float32, copy=False), reason)
        except Exception:  # a broken sink must not stop the other sequences
            log.exception("sink of %s failed; dropping the sequence", s.request_id)
            s.done = True

    def _finish(self, s: Sequence, reason: StopReason) -> None:
        s.done = True
        with self._stats_lock:
            self.stats_data.finished += 1
        self._flush(s, reason)

    def _cancelled(self, s: Sequence) -> None:
        """End a cancelled sequence: it leaves at the next rebuild; its sink hears ``cancelled``
        (a sink whose client is gone may fail to deliver that, which is fine)."""
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
            log.exception("error sink of %s failed", s.request_id)
