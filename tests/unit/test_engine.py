"""The engine and its sampler, without a server: ChatTTS' logits pipeline, per-request
determinism, batch invariance, in-flight joins and leaves, cancellation, admission."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_serving import contract
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.sampling import RequestSampler, sample_batch
from chattts_serving.engine.scheduler import CANCEL_POLL_STEPS, Engine, EngineBusy, EngineConfig
from chattts_serving.engine.sequence import make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.params import ParamError, SamplingParams
from chattts_serving.runtime import Artifacts


def _chattts_filtered_logits(logits: np.ndarray, history: np.ndarray, p: SamplingParams) -> np.ndarray:
    """ChatTTS' own processors (gen_logits) on (4, 626) logits with (steps, 4) history."""
    from ChatTTS.model.processors import gen_logits

    warpers, processors = gen_logits(num_code=625, top_P=p.top_p, top_K=p.top_k,
                                     repetition_penalty=p.repetition_penalty)
    x = torch.from_numpy(logits.copy()) / p.temperature
    tokens = torch.from_numpy(history.T.copy())  # (4, steps)
    for proc in (*processors, *warpers):
        x = proc(tokens, x)
    return x.numpy()


@pytest.mark.parametrize("params, scale", [
    (SamplingParams(), 1.0),                                                                # top-k binds (20)
    (SamplingParams(temperature=0.7, top_p=0.9, top_k=50, repetition_penalty=1.3), 1.0),    # top-k binds (50)
    (SamplingParams(temperature=1.0, top_p=0.2, top_k=1, repetition_penalty=1.0), 1.0),     # min_tokens_to_keep: 3
    (SamplingParams(temperature=1.0, top_p=0.5, top_k=626, repetition_penalty=1.05), 3.0),  # top-p binds
])
def test_sampler_can_draw_exactly_the_tokens_chattts_keeps(params: SamplingParams, scale: float) -> None:
    """The set of codes our sampler draws over many seeds equals, head by head, the set
    ChatTTS' own processors and warpers (gen_logits: repetition penalty, transformers'
    TopPLogitsWarper then TopKLogitsWarper with min_tokens_to_keep=3) leave finite: nothing
    outside it is ever drawn, and every code inside it is (the logits are scaled so that each
    kept code has a few percent of the mass, so 2000 draws reach each of them)."""
    rng = np.random.default_rng(0)
    draws = 2000
    for trial in range(2):
        # logits / temperature have a standard deviation of ``scale`` whatever the temperature
        logits = (rng.normal(0, scale, (1, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS)) * params.temperature
                  ).astype(np.float32)
        history = rng.integers(0, 625, (5 + 4 * trial, contract.NUM_VQ))
        for q in range(contract.NUM_VQ):  # the penalty must matter: penalise some of the strongest codes
            logits[0, q, history[:3, q]] += 2.0 * params.temperature
        allowed = np.isfinite(_chattts_filtered_logits(logits[0], history, params))
        samplers = []
        for draw in range(draws):
            s = RequestSampler(SamplingParams(**{**params.__dict__, "seed": draw}))
            for h in history:
                s.record(h)
            s.steps = 10**6  # past min_new_tokens
            samplers.append(s)
        codes = sample_batch(np.repeat(logits, draws, axis=0), samplers)
        for q in range(contract.NUM_VQ):
            drawn = set(np.unique(codes[:, q]).tolist())
            kept = set(np.flatnonzero(allowed[q]).tolist())
            assert drawn == kept, (f"trial {trial} head {q}: drawn but filtered out by ChatTTS {sorted(drawn - kept)}, "
                                   f"kept by ChatTTS but never drawn {sorted(kept - drawn)}")


def test_sampler_probabilities_follow_chattts_softmax() -> None:
    """With a fixed logits row, the empirical distribution of draws matches ChatTTS'
    post-filter softmax (chi-square-free check: total variation < 0.05 over 4000 draws)."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.0, (1, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS)).astype(np.float32)
    params = SamplingParams(temperature=0.5, top_p=0.7, top_k=20, repetition_penalty=1.0)
    ref = _chattts_filtered_logits(logits[0], np.zeros((0, 4), np.int64), params)
    p_ref = torch.softmax(torch.from_numpy(ref), -1).numpy()
    s = RequestSampler(params)
    s.steps = 10**6
    counts = np.zeros_like(p_ref)
    for _ in range(4000):
        c = sample_batch(logits, [s])[0]
        counts[np.arange(4), c] += 1
    tv = 0.5 * np.abs(counts / 4000 - p_ref).sum(axis=1)
    assert (tv < 0.05).all(), tv


def test_min_new_tokens_suppresses_end_code() -> None:
    logits = np.full((1, contract.NUM_VQ, contract.NUM_AUDIO_TOKENS), -10.0, np.float32)
    logits[..., contract.EOS_CODE] = 10.0
    s = RequestSampler(SamplingParams(min_new_tokens=3, seed=1))
    for step in range(5):
        c = sample_batch(logits, [s])[0]
        assert (c == contract.EOS_CODE).any() == (step >= 3)
        s.record(c)


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(top_k=0), dict(max_new_tokens=0), dict(max_new_tokens=-5),
                                 dict(repetition_penalty=0.5), dict(min_new_tokens=5, max_new_tokens=4),
                                 dict(temperature=float("nan"))])
def test_out_of_range_parameters_are_refused(bad: dict) -> None:
    with pytest.raises(ParamError):
        SamplingParams(**bad).validate()



@pytest.mark.parametrize("max_new_tokens", [-1, 0, 2049, 3000, 5000])
def test_a_max_new_tokens_out_of_the_deployment_range_names_that_range(max_new_tokens: int) -> None:
    """Below 1 or above the cap, one message gives the range this deployment serves, not the
    contract's wider one (a user told [1, 4096] for -1 then learns of 2048 at 3000)."""
    with pytest.raises(ParamError, match=r"out of range \[1, 2048\] \(this deployment's cap\)"):
        SamplingParams(max_new_tokens=max_new_tokens).validate(max_new_tokens_cap=2048)
    SamplingParams(max_new_tokens=2048).validate(max_new_tokens_cap=2048)


Sink = CollectingSink


def _prompt(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(200, 7000, n)
    ids[0], ids[1], ids[-1] = 21131, contract.SPECIAL_TOKEN_IDS["[spk_emb]"], 21132
    return ids


@pytest.fixture(scope="module")
def parts(small_artifacts: Artifacts) -> tuple[GptStepRunner, Embeddings]:
    return GptStepRunner(small_artifacts), Embeddings(small_artifacts)


def _spk(art: Artifacts, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=art.hidden_size).astype(np.float32)
    return v / np.linalg.norm(v)


def _solo(parts, art: Artifacts, ids: np.ndarray, spk: np.ndarray, params: SamplingParams) -> Sink:
    eng = Engine(*parts, EngineConfig())
    sink = Sink()
    eng.submit(make_sequence(ids, spk, params, sink, emit_tokens=3))
    while eng.live_count():
        eng.run_once()
    return sink


def test_each_sequence_in_a_batch_gets_what_it_gets_alone(parts, small_artifacts: Artifacts) -> None:
    """8 requests (different prompts, speakers, seeds, sampling at temperature 0.3) joining a
    running batch at different steps produce exactly their solo codes: no mixing."""
    reqs = [(_prompt(20 + 3 * i, i), _spk(small_artifacts, i),
             SamplingParams(seed=100 + i, max_new_tokens=30 + 5 * i, min_new_tokens=30 + 5 * i)) for i in range(8)]
    solo = [_solo(parts, small_artifacts, *r).all_codes for r in reqs]
    eng = Engine(*parts, EngineConfig(max_batch_size=8))
    sinks = [Sink() for _ in reqs]
    for i, (r, sink) in enumerate(zip(reqs, sinks)):
        eng.submit(make_sequence(r[0], r[1], r[2], sink, emit_tokens=1 + i % 4))
        for _ in range(i % 3):
            eng.run_once()
    while eng.live_count():
        eng.run_once()
    for i, sink in enumerate(sinks):
        np.testing.assert_array_equal(sink.all_codes, solo[i], err_msg=f"request {i} differs from its solo run")
        assert sink.reason == contract.StopReason.MAX_TOKENS
    sizes = {int(k) for k in eng.stats()["batch_sizes"]}  # type: ignore[attr-defined]
    assert max(sizes) >= 6, sizes


def test_a_sequence_is_answered_every_emit_tokens_and_at_each_emit_at_point(parts) -> None:
    """``emit_at`` (a stream's window ready points) adds responses at exactly those token
    counts; the ``emit_tokens`` groups count from the last response, and the codes are the
    ones the sequence gets without points."""
    params = SamplingParams(seed=3, max_new_tokens=30, min_new_tokens=30)
    plain, pointed = Sink(), Sink()
    for sink, at in ((plain, ()), (pointed, (9, 15, 17, 18, 40))):
        eng = Engine(*parts, EngineConfig())
        eng.submit(make_sequence(_prompt(20, 5), None, params, sink, emit_tokens=4, emit_at=at))
        while eng.live_count():
            eng.run_once()
    ends = list(np.cumsum([len(c) for c in pointed.codes]))
    assert ends == [4, 8, 9, 13, 15, 17, 18, 22, 26, 30], ends
    assert list(np.cumsum([len(c) for c in plain.codes])) == [4, 8, 12, 16, 20, 24, 28, 30]
    np.testing.assert_array_equal(pointed.all_codes, plain.all_codes)


@pytest.mark.parametrize("at", [(0, 5), (5, 5), (9, 4), tuple(range(1, 66))])
def test_emit_at_points_are_ascending_positive_and_few(at: tuple[int, ...]) -> None:
    from chattts_serving.engine.request import InvalidSequence

    with pytest.raises(InvalidSequence, match="emit_at_tokens") as err:
        make_sequence(_prompt(20, 5), None, SamplingParams(), Sink(), emit_at=at)
    assert err.value.param == contract.EN_EMIT_AT.name


class _CountingSink(Sink):
    """A sink that counts how often the engine asks whether it was cancelled."""

    def __init__(self, cancel_after: int | None = None) -> None:
        super().__init__(cancel_after=cancel_after)
        self.asked = 0

    def cancelled(self) -> bool:
        self.asked += 1
        return super().cancelled()


def test_a_sink_cancel_is_seen_within_the_poll_interval_and_the_sink_is_not_asked_every_step(
        parts, small_artifacts: Artifacts) -> None:
    """A sink that says cancelled after 4 tokens: its sequence leaves within
    CANCEL_POLL_STEPS iterations while the other runs on; each sink is asked at admission and
    then once per CANCEL_POLL_STEPS iterations (on Triton each question is a server round trip)."""
    eng = Engine(*parts, EngineConfig())
    stay, leave = _CountingSink(), _CountingSink(cancel_after=4)
    eng.submit(make_sequence(_prompt(20, 1), None, SamplingParams(max_new_tokens=40, min_new_tokens=40), stay))
    eng.submit(make_sequence(_prompt(25, 2), None, SamplingParams(max_new_tokens=40, min_new_tokens=40), leave))
    while len(leave.all_codes) < 4:
        eng.run_once()
    for _ in range(CANCEL_POLL_STEPS):
        eng.run_once()
    assert eng.stats()["running"] == 1 and leave.reason == contract.StopReason.CANCELLED
    assert len(leave.all_codes) <= 4 + CANCEL_POLL_STEPS
    iterations = 1 + CANCEL_POLL_STEPS  # the prefill's, then one per decode step
    while eng.live_count():
        eng.run_once()
        iterations += 1
    assert len(stay.all_codes) == 40
    assert eng.stats()["cancelled"] == 1
    assert eng.running() == [] and eng.stats()["running"] == 0
    assert 1 <= stay.asked <= 1 + iterations // CANCEL_POLL_STEPS, (stay.asked, iterations)


def test_an_engine_cancel_ends_the_sequence_at_the_next_iteration(parts, small_artifacts: Artifacts) -> None:
    """Engine.cancel (the BLS's cancel datagram) does not wait for the sink poll."""
    eng = Engine(*parts, EngineConfig())
    stay, leave = Sink(), Sink()
    eng.submit(make_sequence(_prompt(20, 1), None, SamplingParams(max_new_tokens=40, min_new_tokens=40), stay))
    leaving = make_sequence(_prompt(25, 2), None, SamplingParams(max_new_tokens=40, min_new_tokens=40), leave,
                            stream_id="leaving")
    eng.submit(leaving)
    for _ in range(3):
        eng.run_once()
    had = len(leave.all_codes)
    assert eng.cancel(leaving.request.stream_id)
    eng.run_once()
    assert leave.reason == contract.StopReason.CANCELLED and len(leave.all_codes) == had
    assert eng.stats()["running"] == 1
    while eng.live_count():
        eng.run_once()
    assert len(stay.all_codes) == 40


def test_admission_limit_raises_busy_and_accepted_requests_complete(parts) -> None:
    eng = Engine(*parts, EngineConfig(max_batch_size=2, max_waiting=3))
    sinks = [Sink() for _ in range(3)]
    for s in sinks:
        eng.submit(make_sequence(_prompt(12, 5), None, SamplingParams(max_new_tokens=6, min_new_tokens=6), s))
    with pytest.raises(EngineBusy):
        eng.submit(make_sequence(_prompt(12, 5), None, SamplingParams(max_new_tokens=6), Sink()))
    while eng.live_count():
        eng.run_once()
    assert all(len(s.all_codes) == 6 and s.reason == contract.StopReason.MAX_TOKENS for s in sinks)


class _EndCodeAt(GptStepRunner):
    """The real GPT step, except that at call ``call`` (0: the prefill) the end code's logit
    of head ``head`` is raised by 1000 on ``rows``: the model "says" end of sequence there, so
    that an end must come at a known step."""

    def __init__(self, artifacts: Artifacts, call: int, rows: tuple[int, ...], head: int = 2) -> None:
        super().__init__(artifacts)
        self.calls, self.call, self.rows, self.head = 0, call, rows, head

    def _end(self, logits: np.ndarray) -> np.ndarray:
        if self.calls == self.call:
            logits = logits.copy()
            logits[list(self.rows), self.head, contract.EOS_CODE] += 1000.0
        self.calls += 1
        return logits

    def prefill(self, embeds, lengths):  # type: ignore[no-untyped-def]
        logits, hidden, kv = super().prefill(embeds, lengths)
        return self._end(logits), hidden, kv

    def decode(self, embeds, cache, lengths):  # type: ignore[no-untyped-def]
        logits, hidden = super().decode(embeds, cache, lengths)
        return self._end(logits), hidden


def test_eos_ends_a_sequence_at_its_step_without_emitting_the_end_code(parts, small_artifacts: Artifacts) -> None:
    """Three sequences share a batch; at the 11th sampled token the model puts all its mass on
    the end code (one head) for the first and the third. The first ends there with reason
    'eos' after exactly its 10 earlier tokens (the same as without the end code), the end code
    itself not emitted; the third has min_new_tokens=20, so it goes on to max_new_tokens; the
    second, never told to end, gets its solo codes."""
    k, n = 10, 40
    reqs = [(_prompt(18, 70 + i), _spk(small_artifacts, i),
             SamplingParams(seed=20 + i, max_new_tokens=n, min_new_tokens=20 if i == 2 else 0)) for i in range(3)]
    solo = [_solo(parts, small_artifacts, *r) for r in reqs]
    assert all(s.reason == contract.StopReason.MAX_TOKENS for s in solo)  # no end code of their own
    eng = Engine(_EndCodeAt(small_artifacts, call=k, rows=(0, 2)), parts[1], EngineConfig())
    sinks = [Sink() for _ in reqs]
    for r, sink in zip(reqs, sinks):
        eng.submit(make_sequence(r[0], r[1], r[2], sink, emit_tokens=3))  # prefilled together: rows 0, 1, 2
    while eng.live_count():
        eng.run_once()
    ended, other, held = sinks
    assert ended.reason == contract.StopReason.EOS and not ended.errors
    np.testing.assert_array_equal(ended.all_codes, solo[0].all_codes[:k])
    assert (ended.all_codes < contract.EOS_CODE).all()
    assert other.reason == contract.StopReason.MAX_TOKENS
    np.testing.assert_array_equal(other.all_codes, solo[1].all_codes)
    assert held.reason == contract.StopReason.MAX_TOKENS and len(held.all_codes) == n
    np.testing.assert_array_equal(held.all_codes[:k], solo[2].all_codes[:k])
    assert (held.all_codes < contract.EOS_CODE).all()


def test_prompt_longer_than_context_is_refused(parts) -> None:
    eng = Engine(*parts, EngineConfig(max_context_tokens=64))
    with pytest.raises(ValueError, match="context"):
        eng.submit(make_sequence(_prompt(40, 1), None, SamplingParams(max_new_tokens=30), Sink()))


def test_cancel_by_stream_id_ends_the_sequence_with_a_cancelled_reason(parts) -> None:
    eng = Engine(*parts, EngineConfig())
    a, b = Sink(), Sink()
    eng.submit(make_sequence(_prompt(20, 1), None, SamplingParams(max_new_tokens=50, min_new_tokens=50), a,
                        stream_id="keep"))
    eng.submit(make_sequence(_prompt(20, 2), None, SamplingParams(max_new_tokens=50, min_new_tokens=50), b,
                        stream_id="drop"))
    for _ in range(3):
        eng.run_once()
    assert eng.cancel("drop") and not eng.cancel("nobody")
    eng.run_once()
    assert b.reason == contract.StopReason.CANCELLED
    assert eng.stats()["running"] == 1
    while eng.live_count():
        eng.run_once()
    assert a.reason == contract.StopReason.MAX_TOKENS and len(a.all_codes) == 50


def test_waiting_sequences_are_acknowledged_at_once_and_leave_on_cancel_while_slots_are_full(parts) -> None:
    """acknowledge=True: the first sink call is empty and comes at the next engine step, even
    while the sequence waits for a slot; a cancel by id takes it out of the queue before a slot
    frees; without acknowledge nothing is sent before tokens exist."""
    eng = Engine(*parts, EngineConfig(max_batch_size=1))
    hog, waiting, plain = Sink(), Sink(), Sink()
    params = SamplingParams(max_new_tokens=50, min_new_tokens=50)
    eng.submit(make_sequence(_prompt(20, 1), None, params, hog, emit_tokens=50, acknowledge=True, stream_id="hog"))
    eng.run_once()
    assert [len(c) for c in hog.codes] == [0] and hog.reason is None  # the acknowledgement, before any token
    eng.submit(make_sequence(_prompt(20, 2), None, params, waiting, acknowledge=True, stream_id="waiting"))
    eng.submit(make_sequence(_prompt(20, 3), None, params, plain, stream_id="plain"))
    eng.run_once()
    assert [len(c) for c in waiting.codes] == [0] and plain.codes == []  # both still wait for the slot
    assert eng.cancel("waiting")
    eng.run_once()
    assert waiting.reason == contract.StopReason.CANCELLED and eng.live_count() == 2  # the hog runs, plain waits
    assert len(hog.all_codes) < 50
    while eng.live_count():
        eng.run_once()
    assert hog.reason == plain.reason == contract.StopReason.MAX_TOKENS
    assert len(hog.all_codes) == len(plain.all_codes) == 50 and len(waiting.all_codes) == 0


def test_a_waiting_sequence_hears_a_heartbeat_while_the_batch_is_full(parts) -> None:
    """acknowledge=True and a full batch: the queued sequence gets an empty sink call (no
    tokens, no stop reason) whenever ``waiting_heartbeat_s`` has passed since its last one, so
    that the entry's stall watchdog can tell "queued" from "engine dead"; a sequence without
    acknowledge gets none; once running, the waiting one gets its tokens as usual."""
    now = [1000.0]
    eng = Engine(*parts, EngineConfig(max_batch_size=1, waiting_heartbeat_s=0.5), clock=lambda: now[0])
    hog, waiting, plain = Sink(), Sink(), Sink()
    params = SamplingParams(max_new_tokens=30, min_new_tokens=30)
    eng.submit(make_sequence(_prompt(20, 1), None, params, hog, emit_tokens=30, acknowledge=True, stream_id="hog"))
    eng.run_once()
    eng.submit(make_sequence(_prompt(20, 2), None, params, waiting, acknowledge=True, stream_id="waiting"))
    eng.submit(make_sequence(_prompt(20, 3), None, params, plain, stream_id="plain"))
    eng.run_once()
    assert len(waiting.codes) == 1  # the acknowledgement
    eng.run_once()
    assert len(waiting.codes) == 1  # no heartbeat before waiting_heartbeat_s has passed
    for beats in range(1, 4):
        now[0] += 0.55
        eng.run_once()
        assert len(waiting.codes) == 1 + beats and waiting.reason is None
    assert all(len(c) == 0 for c in waiting.codes) and plain.codes == []
    assert len(hog.codes) == 1  # the running hog is not sent anything extra (emit_tokens=30)
    while eng.live_count():
        eng.run_once()
    assert hog.reason == waiting.reason == plain.reason == contract.StopReason.MAX_TOKENS
    assert len(waiting.all_codes) == len(plain.all_codes) == 30


def test_batch_priority_sequences_leave_rows_free_for_realtime_ones(parts) -> None:
    """batch_rows=2 of 3: three batch-priority sequences get 2 rows and the third waits, though
    a row is free; a realtime sequence that comes later takes that row at the next step, ahead
    of the waiting batch one, which runs once a batch row frees. Everyone gets every token."""
    eng = Engine(*parts, EngineConfig(max_batch_size=3, batch_rows=2))
    long_, short = SamplingParams(max_new_tokens=30, min_new_tokens=30), SamplingParams(max_new_tokens=8,
                                                                                        min_new_tokens=8)
    batch = [Sink() for _ in range(3)]
    for i, sink in enumerate(batch):
        eng.submit(make_sequence(_prompt(12, i), None, long_, sink, priority=1, stream_id=f"b{i}"))
    eng.run_once()
    assert eng.stats()["running"] == 2 and eng.stats()["waiting"] == 1
    realtime = Sink()
    eng.submit(make_sequence(_prompt(12, 9), None, short, realtime, priority=0, stream_id="rt"))
    eng.run_once()
    assert eng.stats()["running"] == 3 and len(realtime.all_codes) >= 1 and batch[2].codes == []
    while eng.live_count():
        eng.run_once()
        assert sum(1 for s in eng.running() if not s.done and s.request.priority > 0) <= 2
    assert realtime.reason == contract.StopReason.MAX_TOKENS and len(realtime.all_codes) == 8
    assert all(s.reason == contract.StopReason.MAX_TOKENS and len(s.all_codes) == 30 for s in batch)


def test_the_waiting_limit_counts_requests_not_their_sequences(parts) -> None:
    """At ``max_waiting``, a new request is refused busy, but one more sequence of a request
    that already has a live one (refine-text's segments, ChatTTS' groups of 4) is queued: the
    entry admitted that request; the engine must not fail it halfway."""
    eng = Engine(*parts, EngineConfig(max_batch_size=1, max_waiting=2))
    params = SamplingParams(max_new_tokens=4, min_new_tokens=4)
    sinks = [Sink() for _ in range(5)]
    eng.submit(make_sequence(_prompt(12, 1), None, params, sinks[0], request_id="a"))
    eng.submit(make_sequence(_prompt(12, 2), None, params, sinks[1], request_id="b"))
    with pytest.raises(EngineBusy):
        eng.submit(make_sequence(_prompt(12, 3), None, params, Sink(), request_id="c"))
    with pytest.raises(EngineBusy):
        eng.submit(make_sequence(_prompt(12, 3), None, params, Sink()))  # no request id: a request of its own
    eng.submit(make_sequence(_prompt(12, 4), None, params, sinks[2], request_id="a"))
    eng.submit(make_sequence(_prompt(12, 5), None, params, sinks[3], request_id="b"))
    eng.run_once()  # "a" runs; its second sequence and both of "b" wait: 2 requests
    eng.submit(make_sequence(_prompt(12, 6), None, params, sinks[4], request_id="a"))
    with pytest.raises(EngineBusy, match="2 requests already waiting"):
        eng.submit(make_sequence(_prompt(12, 7), None, params, Sink(), request_id="d"))
    while eng.live_count():
        eng.run_once()
    assert all(s.reason == contract.StopReason.MAX_TOKENS and len(s.all_codes) == 4 for s in sinks)


def test_finished_rows_are_reused_by_newcomers_without_mixing(parts, small_artifacts: Artifacts) -> None:
    """With 2 slots and 6 requests of different lengths, newcomers take over the rows of
    finished sequences (row reuse, no full rebuild) and still get exactly their solo codes."""
    reqs = [(_prompt(18 + 5 * i, 40 + i), _spk(small_artifacts, i),
             SamplingParams(seed=7 * i, max_new_tokens=12 + 9 * i, min_new_tokens=12 + 9 * i)) for i in range(6)]
    solo = [_solo(parts, small_artifacts, *r).all_codes for r in reqs]
    eng = Engine(*parts, EngineConfig(max_batch_size=2))
    sinks = [Sink() for _ in reqs]
    for r, sink in zip(reqs, sinks):
        eng.submit(make_sequence(r[0], r[1], r[2], sink, emit_tokens=2))
    while eng.live_count():
        eng.run_once()
    for i, sink in enumerate(sinks):
        np.testing.assert_array_equal(sink.all_codes, solo[i], err_msg=f"request {i}")
    stats = eng.stats()
    assert stats["row_reuses"] >= 2, stats
    assert eng.running() == []


def test_the_kv_cache_is_allocated_once_and_written_in_place(parts, small_artifacts: Artifacts) -> None:
    """Requests joining and leaving a running batch over 300 steps: the KV buffers are the
    same arrays at the same addresses throughout (no growth, compaction or per-step copy),
    each decode step writes exactly one new column per running row (the one after its
    positions) and leaves every other held position untouched, and the outputs are the solo
    ones."""
    reqs = [(_prompt(20 + 4 * i, 60 + i), _spk(small_artifacts, i),
             SamplingParams(seed=i, max_new_tokens=25 + 7 * i, min_new_tokens=25 + 7 * i)) for i in range(6)]
    solo = [_solo(parts, small_artifacts, *r).all_codes for r in reqs]
    eng = Engine(*parts, EngineConfig(max_batch_size=3))
    cache = eng._batch.cache
    bufs = list(cache.buffers)
    ptrs = [b.ctypes.data for b in bufs]
    sinks = [Sink() for _ in reqs]
    for r, sink in zip(reqs, sinks):
        eng.submit(make_sequence(r[0], r[1], r[2], sink))
    while eng.live_count():
        before = [b.copy() for b in cache.buffers]
        rows = {id(s): eng._batch.row_of(s) for s in eng.running()}
        lengths = eng._batch.lengths.copy()
        eng.run_once()
        for s in eng.running():
            r = rows.get(id(s))
            if r is None or s.done:
                continue  # joined in this iteration
            n = int(lengths[r])
            for old, new in zip(before, cache.buffers):
                np.testing.assert_array_equal(new[r, :, :n], old[r, :, :n])  # held positions untouched
                assert not np.array_equal(new[r, :, n], old[r, :, n])  # the new one written
        assert all(a is b for a, b in zip(bufs, cache.buffers))
    assert [b.ctypes.data for b in cache.buffers] == ptrs
    for i, sink in enumerate(sinks):
        np.testing.assert_array_equal(sink.all_codes, solo[i])
    assert eng.stats()["row_reuses"] >= 3


def test_rows_of_different_lengths_decode_together(parts, small_artifacts: Artifacts) -> None:
    """A long-running sequence and short ones that join, end and leave beside it: the decode
    step covers rows of very different lengths (no common width, no padding columns) and
    each gets its solo codes; the long one's row never moves."""
    long_req = (_prompt(40, 90), _spk(small_artifacts, 9), SamplingParams(seed=5, max_new_tokens=90,
                                                                        min_new_tokens=90))
    short = [(_prompt(12 + i, 91 + i), None, SamplingParams(seed=i, max_new_tokens=6, min_new_tokens=6))
             for i in range(8)]
    solo_long = _solo(parts, small_artifacts, *long_req).all_codes
    solo_short = [_solo(parts, small_artifacts, *r).all_codes for r in short]
    eng = Engine(*parts, EngineConfig(max_batch_size=2))
    first = Sink()
    eng.submit(make_sequence(*long_req, first))
    eng.run_once()
    row = eng._batch.row_of(eng.running()[0])
    sinks = [Sink() for _ in short]
    for r, sink in zip(short, sinks):
        eng.submit(make_sequence(r[0], r[1], r[2], sink))
    spans = set()
    while eng.live_count():
        eng.run_once()
        if first.reason is None:
            assert eng._batch.seqs[row] is not None and eng._batch.seqs[row].sink is first  # type: ignore[union-attr]
        spans.add(tuple(eng._batch.lengths))
    np.testing.assert_array_equal(first.all_codes, solo_long)
    for i, sink in enumerate(sinks):
        np.testing.assert_array_equal(sink.all_codes, solo_short[i])
    assert any(a and b and abs(a - b) > 30 for a, b in spans)
