"""The baseline: upstream ChatTTS (torch eager, ``Chat.infer``) serving one request at a time.

This is the seed article's synchronous "V1": a server that runs ``Chat.infer`` for each request
in turn. Its latency per request is the whole synthesis; its throughput is one request's.
ChatTTS' own streaming mode (``stream=True``) is measured separately for its first chunk.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..text.speaker import encode_spk_emb, speaker_from_seed
from .stats import RequestRecord, percentile, summarize


def baseline_speaker(artifacts_dir: Path, voice_seed: int) -> str:
    """The ChatTTS ``spk_emb`` string of voice seed ``voice_seed``: the same speaker vector our
    front end uses for ``voice=str(voice_seed)`` (and ``torch.manual_seed(seed);
    chat.sample_random_speaker()`` gives), from the artifacts' speaker statistics."""
    stats = np.load(Path(artifacts_dir) / contract.SPEAKER_FILE)
    return encode_spk_emb(speaker_from_seed(voice_seed, stats["std"], stats["mean"]))


def _params(chat: Any, spk: str, tokens: int, seed: int) -> Any:
    """Fresh InferCodeParams per call (ChatTTS' defaults are shared mutable objects)."""
    return chat.InferCodeParams(spk_emb=spk, max_new_token=tokens, min_new_token=tokens, show_tqdm=False,
                                manual_seed=seed)


def run_baseline(weights_dir: Path, artifacts_dir: Path, sentences: Sequence[str], *, tokens: int,
                 requests: int, stream_requests: int, voice_seed: int,
                 progress: Callable[[str], None] = lambda _m: None) -> dict[str, object]:
    """Load ChatTTS from ``weights_dir`` and measure it, one request at a time.

    Offline: ``requests`` calls of ``chat.infer([text], skip_refine_text=True)`` with exactly
    ``tokens`` tokens each (min = max), texts ``sentences[i % len]``, sampler seed ``i``;
    per-request latency (s), requests/s, audio s per wall s, RTF. Stream: ``stream_requests``
    calls with ``stream=True``; first_chunk_s is the time (s) to the first yielded non-empty
    chunk, total_s to the generator's end. One unmeasured warm-up call precedes each mode.

    Returns a JSON-able dict: load_s, torch_threads, offline (summary + records), stream
    (first_chunk_p50_s, first_chunk_mean_s, records). Raises WeightsError from
    :func:`chattts_serving.export.weights.load_chat` on unusable weights.
    """
    import torch

    from ..export.weights import load_chat

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
                                         1, tokens))
        except Exception as exc:  # the benchmark reports failures instead of aborting
            records.append(RequestRecord(i, text(i), t0 - started, None, time.perf_counter() - t0, 0.0, 0,
                                         tokens, f"{type(exc).__name__}: {exc}"))
        progress(f"baseline offline {i + 1}/{requests}: {records[-1].total_s:.2f} s")
    wall = time.perf_counter() - started
    offline = summarize(records, wall)

    stream_records: list[dict[str, object]] = []
    if stream_requests > 0:
        _consume_stream(chat, text(0), spk, min(tokens, 16), 0)  # warm-up
    for i in range(stream_requests):
        first, total, samples, chunks = _consume_stream(chat, text(i), spk, tokens, i)
        stream_records.append({"index": i, "text": text(i), "first_chunk_s": first, "total_s": total,
                               "audio_s": samples / contract.SAMPLE_RATE_HZ, "chunks": chunks})
        progress(f"baseline stream {i + 1}/{stream_requests}: first chunk {first:.2f} s, total {total:.2f} s")
    firsts = [float(r["first_chunk_s"]) for r in stream_records if r["first_chunk_s"] is not None]  # type: ignore[arg-type]
    defaults = chat.InferCodeParams()
    result: dict[str, object] = {
        "load_s": load_s, "torch_threads": torch.get_num_threads(), "tokens": tokens,
        "offline": {**offline, "records": [r.to_json() for r in records]},
        "stream": {"first_chunk_p50_s": percentile(firsts, 50),
                   "first_chunk_mean_s": float(np.mean(firsts)) if firsts else None,
                   "total_p50_s": percentile([float(r["total_s"]) for r in stream_records], 50),  # type: ignore[arg-type]
                   "stream_batch_tokens": defaults.stream_batch,
                   "pass_first_n_batches": defaults.pass_first_n_batches,
                   "records": stream_records},
    }
    del chat
    gc.collect()
    return result


def _consume_stream(chat: Any, text: str, spk: str, tokens: int,
                    seed: int) -> tuple[float | None, float, int, int]:
    """Run ChatTTS' stream mode to the end: (first non-empty chunk s or None, total s,
    samples, non-empty chunks)."""
    t0 = time.perf_counter()
    first: float | None = None
    samples = chunks = 0
    for wavs in chat.infer([text], stream=True, skip_refine_text=True,
                           params_infer_code=_params(chat, spk, tokens, seed)):
        n = int(np.asarray(wavs).size)
        if n:
            if first is None:
                first = time.perf_counter() - t0
            samples += n
            chunks += 1
    return first, time.perf_counter() - t0, samples, chunks
