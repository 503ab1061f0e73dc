"""The baselines: upstream ChatTTS (torch eager, ``Chat.infer``) served as a user would serve it.

Three ways a user would serve upstream ChatTTS, each a baseline of its own: one request at a
time (the seed article's synchronous "V1": latency is the whole synthesis, throughput one
request's), ``Chat.infer`` over a list of texts (ChatTTS batches them in one GPT batch), and
its own streaming mode (``stream=True``) at its default and at smaller ``stream_batch``
settings, for the first chunk.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chattts_serving import contract
from chattts_serving.text.speaker import encode_spk_emb, speaker_from_seed

from .cpuload import CpuWindow
from .outcomes import Outcome
from .stats import RequestRecord, fmt, percentile, ratio, summarize


def baseline_speaker(artifacts_dir: Path, voice_seed: int) -> str:
    """The ChatTTS ``spk_emb`` string of voice seed ``voice_seed``: the same speaker vector our
    front end uses for ``voice=str(voice_seed)`` (and ``torch.manual_seed(seed);
    chat.sample_random_speaker()`` gives), from the artifacts' speaker statistics."""
    stats = np.load(Path(artifacts_dir) / contract.SPEAKER_FILE)
    return encode_spk_emb(speaker_from_seed(voice_seed, stats["std"], stats["mean"]))


def _params(chat: Any, spk: str, tokens: int, seed: int, stream_batch: int | None = None,
            pass_first_n_batches: int | None = None) -> Any:
    """Fresh InferCodeParams per call (ChatTTS' defaults are shared mutable objects); the
    stream settings stay ChatTTS' defaults unless given."""
    extra = {k: v for k, v in (("stream_batch", stream_batch), ("pass_first_n_batches", pass_first_n_batches))
             if v is not None}
    return chat.InferCodeParams(spk_emb=spk, max_new_token=tokens, min_new_token=tokens, show_tqdm=False,
                                manual_seed=seed, **extra)


STREAM_SETTINGS: tuple[tuple[int, int], ...] = ((8, 0), (4, 0))
"""ChatTTS stream settings measured besides its default (stream_batch 24 after
pass_first_n_batches 2): (stream_batch tokens, pass_first_n_batches). With 0 batches passed
the first yield comes after stream_batch tokens; each yield re-decodes the whole prefix."""
PRACTICAL_TOTAL_FACTOR = 1.25
"""A stream setting is practical when its total time (p50) is at most this many times the
one-at-a-time ``Chat.infer`` latency (p50): a smaller ``stream_batch`` re-decodes the prefix
more often, and the smallest practical one is the best first-chunk time a user could pick."""


def run_baseline(weights_dir: Path, artifacts_dir: Path, sentences: Sequence[str], *, tokens: int,
                 requests: int, stream_requests: int, voice_seed: int, batch: int = 16, batched_repeats: int = 1,
                 stream_settings: Sequence[tuple[int, int]] = STREAM_SETTINGS,
                 progress: Callable[[str], None] = lambda _m: None) -> dict[str, object]:
    """Load ChatTTS from ``weights_dir`` and measure three ways a user would serve it.

    offline (one at a time): ``requests`` calls of ``chat.infer([text], skip_refine_text=True)``
    with exactly ``tokens`` tokens each (min = max), texts ``sentences[i % len]``, sampler
    seed ``i``; per-request latency (s), requests/s, audio s per wall s, RTF.
    batched: ``batched_repeats`` calls of ``chat.infer(texts)`` over ``batch`` texts at once
    (``split_text=False``: one GPT batch of all of them, as ChatTTS batches a list); wall s
    per call, audio s per wall s, requests/s.
    stream: ``stream_requests`` calls with ``stream=True`` at ChatTTS' default stream
    settings (``stream``) and at each of ``stream_settings`` (``stream_settings``); first_chunk_s
    is the time (s) to the first yielded non-empty chunk, total_s to the generator's end; the
    smallest practical setting (:data:`PRACTICAL_TOTAL_FACTOR`) is ``stream_smallest``.
    One unmeasured warm-up call precedes each mode. Each part has its own ``cpu``
    (:class:`~bench.cpuload.CpuWindow`).

    Returns a JSON-able dict: load_s, torch_threads, tokens, offline (summary + records, cpu),
    batched, stream (first_chunk_p50_s, first_chunk_mean_s, total_p50_s, stream_batch_tokens,
    pass_first_n_batches, records, cpu), stream_settings (the same for each setting),
    stream_smallest (the smallest practical setting's entry, or None). Raises WeightsError
    from :func:`chattts_serving.export.weights.load_chat` on unusable weights.
    """
    import torch

    from chattts_serving.export.weights import load_chat

    for name in ("ChatTTS", "chattts_serving.chattts"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t = time.perf_counter()
    chat = load_chat(Path(weights_dir))
    load_s = time.perf_counter() - t
    spk = baseline_speaker(artifacts_dir, voice_seed)
    progress(f"baseline: ChatTTS loaded in {load_s:.1f} s ({torch.get_num_threads()} torch threads)")

    def text(i: int) -> str:
        return sentences[i % len(sentences)]

    # warm-up: first calls pay lazy initialisation (allocator, normaliser, kernels)
    chat.infer([text(0)], skip_refine_text=True, params_infer_code=_params(chat, spk, min(tokens, 16), 0))

    window = CpuWindow()
    records: list[RequestRecord] = []
    started = time.perf_counter()
    for i in range(requests):
        t0 = time.perf_counter()
        try:
            wavs = chat.infer([text(i)], skip_refine_text=True,
                              params_infer_code=_params(chat, spk, tokens, i))
            total = time.perf_counter() - t0
            n = int(sum(np.asarray(w).size for w in wavs))
            records.append(RequestRecord(i, text(i), t0 - started, None, total, n / contract.SAMPLE_RATE_HZ,
                                         1, tokens, tokens_requested=tokens))
        except Exception as exc:  # the benchmark reports failures instead of aborting
            records.append(RequestRecord(i, text(i), t0 - started, None, time.perf_counter() - t0, 0.0, 0,
                                         0, f"{type(exc).__name__}: {exc}", tokens_requested=tokens,
                                         outcome=str(Outcome.SERVER_ERROR)))
        progress(f"baseline offline {i + 1}/{requests}: {records[-1].total_s:.2f} s")
    wall = time.perf_counter() - started
    offline = {**summarize(records, wall), "records": [r.to_json() for r in records], "cpu": window.stop()}

    batched = _batched(chat, spk, [text(i) for i in range(batch)], tokens, batched_repeats, progress) \
        if batched_repeats > 0 and batch > 0 else None

    defaults = chat.InferCodeParams()
    settings = [(int(defaults.stream_batch), int(defaults.pass_first_n_batches)), *stream_settings]
    streams = []
    if stream_requests > 0:
        _consume_stream(chat, text(0), spk, min(tokens, 16), 0)  # warm-up
        for k, passed in settings:
            streams.append(_stream_setting(chat, spk, text, tokens, stream_requests, k, passed, progress))
    offline_p50 = offline.get("latency_p50_s")
    for entry in streams:
        entry["practical"] = (entry["total_p50_s"] is not None and isinstance(offline_p50, float)
                              and entry["total_p50_s"] <= PRACTICAL_TOTAL_FACTOR * offline_p50)
    practical = [e for e in streams if e["practical"] and e["first_chunk_p50_s"] is not None]
    result: dict[str, object] = {
        "load_s": load_s, "torch_threads": torch.get_num_threads(), "tokens": tokens, "offline": offline,
        "batched": batched,
        "stream": streams[0] if streams else None,
        "stream_settings": streams,
        "stream_smallest": min(practical, key=lambda e: e["stream_batch_tokens"]) if practical else None,
        "practical_total_factor": PRACTICAL_TOTAL_FACTOR,
    }
    del chat
    gc.collect()
    return result


def _batched(chat: Any, spk: str, texts: list[str], tokens: int, repeats: int,
             progress: Callable[[str], None]) -> dict[str, object]:
    """``repeats`` timed ``chat.infer(texts, split_text=False)`` calls after one short warm-up
    of the same batch: calls (wall s, audio s each), and over all calls wall_s, audio_s_total,
    audio_s_per_s, requests_per_s, latency_p50_s (every request of a call ends with it)."""
    chat.infer(texts, skip_refine_text=True, split_text=False, params_infer_code=_params(chat, spk, min(tokens, 16), 0))
    window = CpuWindow()
    calls = []
    for r in range(repeats):
        t0 = time.perf_counter()
        wavs = chat.infer(texts, skip_refine_text=True, split_text=False,
                          params_infer_code=_params(chat, spk, tokens, 7000 + r))
        wall = time.perf_counter() - t0
        audio = sum(int(np.asarray(w).size) for w in wavs) / contract.SAMPLE_RATE_HZ
        calls.append({"wall_s": wall, "audio_s": audio, "outputs": len(wavs)})
        progress(f"baseline batched {r + 1}/{repeats}: {len(texts)} texts in {wall:.2f} s")
    wall_total = sum(c["wall_s"] for c in calls)
    audio_total = sum(c["audio_s"] for c in calls)
    return {"texts": len(texts), "repeats": repeats, "calls": calls, "wall_s": wall_total,
            "audio_s_total": audio_total, "audio_s_per_s": ratio(audio_total, wall_total),
            "requests_per_s": ratio(len(texts) * repeats, wall_total),
            "latency_p50_s": percentile([c["wall_s"] for c in calls], 50), "cpu": window.stop()}


def _stream_setting(chat: Any, spk: str, text: Callable[[int], str], tokens: int, requests: int, k: int,
                    passed: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """``requests`` stream-mode calls at ``stream_batch=k``, ``pass_first_n_batches=passed``."""
    window = CpuWindow()
    records: list[dict[str, object]] = []
    for i in range(requests):
        first, total, samples, chunks = _consume_stream(chat, text(i), spk, tokens, i, k, passed)
        records.append({"index": i, "text": text(i), "first_chunk_s": first, "total_s": total,
                        "audio_s": samples / contract.SAMPLE_RATE_HZ, "chunks": chunks})
        progress(f"baseline stream (stream_batch {k}, {passed} passed) {i + 1}/{requests}: first chunk "
                 f"{fmt(first, 2)} s, total {total:.2f} s")
    firsts = [float(r["first_chunk_s"]) for r in records if r["first_chunk_s"] is not None]  # type: ignore[arg-type]
    return {"stream_batch_tokens": k, "pass_first_n_batches": passed,
            "first_audio_after_tokens": k * (passed + 1),
            "first_chunk_p50_s": percentile(firsts, 50),
            "first_chunk_mean_s": float(np.mean(firsts)) if firsts else None,
            "total_p50_s": percentile([float(r["total_s"]) for r in records], 50),  # type: ignore[arg-type]
            "records": records, "cpu": window.stop()}


def _consume_stream(chat: Any, text: str, spk: str, tokens: int, seed: int, stream_batch: int | None = None,
                    pass_first_n_batches: int | None = None) -> tuple[float | None, float, int, int]:
    """Run ChatTTS' stream mode to the end: (first non-empty chunk s or None, total s,
    samples, non-empty chunks)."""
    t0 = time.perf_counter()
    first: float | None = None
    samples = chunks = 0
    for wavs in chat.infer([text], stream=True, skip_refine_text=True,
                           params_infer_code=_params(chat, spk, tokens, seed, stream_batch, pass_first_n_batches)):
        n = int(np.asarray(wavs).size)
        if n:
            if first is None:
                first = time.perf_counter() - t0
            samples += n
            chunks += 1
    return first, time.perf_counter() - t0, samples, chunks
