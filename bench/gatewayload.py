"""The OpenAI gateway's overhead: the same requests through ``POST /v1/audio/speech`` and
directly over gRPC, against one running Triton server.

The gateway runs as its own process (``python -m chattts_serving.gateway``), as it is
deployed, on the same host as the server and the clients. At each concurrency level the same
jobs run twice through closed-loop client threads, first directly (gRPC streams,
:func:`~bench.serverload.run_closed_loop`), then through the gateway (HTTP,
``response_format`` pcm, streamed). Time to first audio is the first audio bytes the client
receives on either path. The figures are gateway / direct ratios (:data:`GATEWAY_FIGURES`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import psutil

from chattts_serving import contract

from .outcomes import Outcome, classify_error
from .serverload import Job, run_closed_loop
from .stats import RequestRecord, phase_section, ratio, summarize

GATEWAY_FIGURES: Final = ("gateway_ttfa_ratio_c1", "gateway_ttfa_ratio_c16", "gateway_throughput_ratio_c16")
"""bench.json figures: TTFA p50 through the gateway over TTFA p50 over direct gRPC at
concurrency 1 and 16, and audio seconds per wall second through the gateway over direct at 16
(1.0: no overhead)."""
FIRST_BYTE_FORMATS: Final = ("pcm", "wav", "mp3", "opus", "aac", "flac")
"""The ``response_format`` values whose time to first byte the gateway phase measures (pcm first:
the others are compared with it)."""
FIRST_BYTE_FIGURES: Final = tuple(f"gateway_first_byte_gap_s_{f}" for f in FIRST_BYTE_FORMATS[1:])
"""bench.json figures: time to the first body byte of ``POST /v1/audio/speech`` in each format,
p50 over the runs, less pcm's, in seconds (target: at most 0.1 s: every encoder gives bytes as
soon as the first chunk is in)."""
FIRST_BYTE_RUNS: Final = 5
"""Requests per format in the first-byte measurement (the formats interleaved round by round)."""
PCM_BYTES_PER_SAMPLE: Final = 2
START_TIMEOUT_S: Final = 60.0


class GatewayStartError(RuntimeError):
    """The gateway process did not answer ready in time (message: the reason and its log)."""


@contextlib.contextmanager
def gateway_process(grpc_url: str, port: int, log_path: Path) -> Iterator[tuple[str, psutil.Process]]:
    """Start the gateway in front of ``grpc_url`` on ``port`` (no API key, its output to
    ``log_path``); yield (base URL, its process) once ``/health`` answers 200; stop it after.

    Raises :class:`GatewayStartError` when it does not become ready within 60 s.
    """
    env = {k: v for k, v in os.environ.items() if k != "CHATTTS_API_KEY"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "chattts_serving.gateway", "--triton-url", grpc_url,
                                 "--port", str(port), "--log-level", "warning"], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise GatewayStartError(f"the gateway exited with {proc.returncode}: {_tail(log_path)}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise GatewayStartError(f"the gateway was not ready within {START_TIMEOUT_S:g} s: {_tail(log_path)}")
            time.sleep(0.2)
        yield url, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class _HttpStatus(RuntimeError):
    """A gateway answer other than 200, with the benchmark outcome its status means."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.outcome = (Outcome.REFUSED_BUSY if status in (429, 503) else
                        Outcome.REFUSED_INVALID if 400 <= status < 500 else Outcome.SERVER_ERROR)


def speech_request(url: str, job: Job, voice: str, level_t0: float, timeout_s: float) -> RequestRecord:
    """One ``POST /v1/audio/speech`` (pcm, exactly ``job.tokens`` tokens) to the gateway at ``url``,
    read as it streams: a :class:`RequestRecord` like the gRPC one (TTFA at the first audio
    bytes; errors recorded, never raised)."""
    host, tokens = url.removeprefix("http://"), job.tokens
    body = json.dumps({"model": "tts-1", "input": job.text, "voice": voice, "response_format": "pcm",
                       "seed": job.seed, "max_new_tokens": tokens, "min_new_tokens": tokens})
    start = time.perf_counter()
    ttfa: float | None = None
    received = chunks = 0
    conn = http.client.HTTPConnection(host, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/audio/speech", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise _HttpStatus(resp.status, resp.read()[:200].decode(errors="replace"))
        while data := resp.read1(1 << 16):
            if ttfa is None:
                ttfa = time.perf_counter() - start
            chunks += 1
            received += len(data)
    except Exception as exc:  # a benchmark reports failures; it does not die on them
        outcome = exc.outcome if isinstance(exc, _HttpStatus) else classify_error(exc)
        return RequestRecord(job.index, job.text, start - level_t0, None, time.perf_counter() - start, 0.0, 0, 0,
                             f"{outcome}: {type(exc).__name__}: {exc}", tokens_requested=tokens,
                             outcome=str(outcome))
    finally:
        conn.close()
    audio_s = received / PCM_BYTES_PER_SAMPLE / contract.SAMPLE_RATE_HZ
    # min = max new tokens: a completed request generated exactly ``tokens``
    return RequestRecord(job.index, job.text, start - level_t0, ttfa, time.perf_counter() - start, audio_s, chunks,
                         tokens, tokens_requested=tokens)


def first_byte_s(url: str, text: str, fmt: str, tokens: int, voice: str, seed: int, timeout_s: float) -> float:
    """Seconds from sending one ``POST /v1/audio/speech`` (``fmt``, exactly ``tokens`` tokens) to
    the gateway at ``url`` to its first body byte; the body is then read to its end. Raises
    RuntimeError for an answer other than 200 or an empty body."""
    body = json.dumps({"model": "tts-1", "input": text, "voice": voice, "response_format": fmt, "seed": seed,
                       "max_new_tokens": tokens, "min_new_tokens": tokens})
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=timeout_s)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/audio/speech", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{fmt}: HTTP {resp.status}: {resp.read()[:200]!r}")
        first = resp.read1(1 << 16)
        elapsed = time.perf_counter() - start
        if not first:
            raise RuntimeError(f"{fmt}: empty body")
        while resp.read1(1 << 16):
            pass
        return elapsed
    finally:
        conn.close()


def run_first_byte(url: str, text: str, *, tokens: int, voice: str, runs: int = FIRST_BYTE_RUNS,
                   timeout_s: float = 600.0) -> dict[str, Any]:
    """Time to first byte per format through the gateway at ``url``: ``runs`` rounds, each one
    request per format of :data:`FIRST_BYTE_FORMATS` one after the other (the order rotated
    each round), the same text, seed and token count for all. Returns ``{"runs", "tokens",
    "formats": {fmt: {"first_byte_s": [...], "p50_s"}}, "gap_p50_s": {fmt: p50 - pcm's p50}}``
    (a format whose requests failed has ``error`` instead)."""
    times: dict[str, list[float]] = {f: [] for f in FIRST_BYTE_FORMATS}
    errors: dict[str, str] = {}
    for r in range(runs):
        order = FIRST_BYTE_FORMATS[r % len(FIRST_BYTE_FORMATS):] + FIRST_BYTE_FORMATS[:r % len(FIRST_BYTE_FORMATS)]
        for fmt in order:
            try:
                times[fmt].append(first_byte_s(url, text, fmt, tokens, voice, 4000 + r, timeout_s))
            except Exception as exc:  # a benchmark reports failures; it does not die on them
                errors[fmt] = f"{type(exc).__name__}: {exc}"
    formats: dict[str, Any] = {}
    for fmt, ts in times.items():
        formats[fmt] = {"first_byte_s": [round(t, 4) for t in ts],
                        "p50_s": round(float(np.median(ts)), 4) if ts else None}
        if fmt in errors:
            formats[fmt]["error"] = errors[fmt]
    pcm = formats["pcm"]["p50_s"]
    gaps = {fmt: (round(v["p50_s"] - pcm, 4) if v["p50_s"] is not None and pcm is not None else None)
            for fmt, v in formats.items() if fmt != "pcm"}
    return {"runs": runs, "tokens": tokens, "formats": formats, "gap_p50_s": gaps}


def first_byte_figures(result: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The :data:`FIRST_BYTE_FIGURES` of a gateway phase result (None where not measured)."""
    gaps = ((result or {}).get("first_byte") or {}).get("gap_p50_s") or {}
    return {f"gateway_first_byte_gap_s_{fmt}": gaps.get(fmt) for fmt in FIRST_BYTE_FORMATS[1:]}


def run_gateway_overhead(grpc_url: str, sentences: Sequence[str], *, levels: Sequence[int],
                         requests_for: Callable[[int], int], tokens: int, voice: str, port: int,
                         log_path: Path, timeout_s: float = 600.0,
                         progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Measure the gateway (started on ``port``) against direct gRPC at each concurrency level
    (see the module).

    Level c sends ``requests_for(c)`` jobs (texts cycling through ``sentences``, seeds
    2000*c + i) on each path, after one unmeasured warm-up request on each. Returns
    ``{"levels": [{"concurrency", "direct": summary, "gateway": summary, "gateway_cpu_s",
    "errors"}], "first_byte": ..., "log": log_path}`` (summaries as
    :func:`~bench.stats.summarize`; ``first_byte``: :func:`run_first_byte` at
    ``tokens``, after the levels, on the idle server), or ``{"error": reason}`` when the gateway
    could not start.
    """
    try:
        with gateway_process(grpc_url, port, log_path) as (url, proc):
            warm = [Job(0, sentences[0], 0, tokens)]
            run_closed_loop(grpc_url, warm, 1, voice=voice, timeout_s=timeout_s)
            run_closed_loop(url, warm, 1, voice=voice, timeout_s=timeout_s, send=speech_request)
            out = []
            for c in levels:
                jobs = [Job(i, sentences[i % len(sentences)], 2000 * c + i, tokens) for i in range(requests_for(c))]
                direct, direct_wall = run_closed_loop(grpc_url, jobs, c, voice=voice,
                                                      timeout_s=timeout_s)
                cpu0 = sum(proc.cpu_times()[:2])
                via, via_wall = run_closed_loop(url, jobs, c, voice=voice, timeout_s=timeout_s,
                                                send=speech_request)
                level = {"concurrency": c, "direct": summarize(direct, direct_wall),
                         "gateway": summarize(via, via_wall), "gateway_cpu_s": sum(proc.cpu_times()[:2]) - cpu0,
                         "errors": sorted({r.error for r in direct + via if r.error})[:5]}
                out.append(level)
                progress(f"gateway c={c}: TTFA p50 {_fmt(level['gateway']['ttfa_p50_s'])} s vs direct "
                         f"{_fmt(level['direct']['ttfa_p50_s'])} s; {_fmt(level['gateway']['audio_s_per_s'])} vs "
                         f"{_fmt(level['direct']['audio_s_per_s'])} audio s/s")
            first = run_first_byte(url, sentences[0], tokens=tokens, voice=voice, timeout_s=timeout_s)
            progress("gateway first byte, s over pcm (p50): " + ", ".join(
                f"{fmt} {_fmt(gap)}" for fmt, gap in first["gap_p50_s"].items()))
            return {"levels": out, "first_byte": first, "log": str(log_path)}
    except GatewayStartError as exc:
        progress(f"gateway: {exc}")
        return {"error": str(exc), "levels": []}


def _fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _level(result: Mapping[str, Any] | None, c: int) -> Mapping[str, Any]:
    for lv in (result or {}).get("levels", []):
        if lv["concurrency"] == c:
            return lv
    return {}


def gateway_figures(result: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The :data:`GATEWAY_FIGURES` of a :func:`run_gateway_overhead` result (None where a level
    is missing)."""
    c1, c16 = _level(result, 1), _level(result, 16)

    def of(level: Mapping[str, Any], key: str) -> float | None:
        return ratio(level.get("gateway", {}).get(key), level.get("direct", {}).get(key))

    return {"gateway_ttfa_ratio_c1": of(c1, "ttfa_p50_s"), "gateway_ttfa_ratio_c16": of(c16, "ttfa_p50_s"),
            "gateway_throughput_ratio_c16": of(c16, "audio_s_per_s")}


def gateway_markdown(result: Mapping[str, Any]) -> list[str]:
    """The report's section on the gateway (empty when the phase did not run)."""
    gw, lines = phase_section(result, "gateway",
                              "OpenAI gateway overhead (`/v1/audio/speech`, pcm) against direct gRPC")
    if gw is None:
        return lines
    lines += ["The same requests at each level, directly over gRPC then through the gateway (its own process "
              "on the same cores). Ratios are gateway / direct.", "",
              "| c | TTFA p50 direct s | TTFA p50 gateway s | ratio | audio s/s direct | audio s/s gateway | ratio "
              "| gateway CPU s |", "|---|---|---|---|---|---|---|---|"]
    for lv in gw["levels"]:
        d, g = lv["direct"], lv["gateway"]
        lines.append(f"| {lv['concurrency']} | {_f(d['ttfa_p50_s'])} | {_f(g['ttfa_p50_s'])} | "
                     f"{_f(ratio(g['ttfa_p50_s'], d['ttfa_p50_s']))} | {_f(d['audio_s_per_s'])} | "
                     f"{_f(g['audio_s_per_s'])} | {_f(ratio(g['audio_s_per_s'], d['audio_s_per_s']))} | "
                     f"{_f(lv['gateway_cpu_s'], 1)} |")
    errors = [e for lv in gw["levels"] for e in lv.get("errors", [])]
    if errors:
        lines += ["", "Errors: " + "; ".join(errors[:5])]
    first = gw.get("first_byte")
    if first:
        lines += ["", f"Time to the first body byte per `response_format` ({first['runs']} requests each, "
                  f"{first['tokens']} tokens, one at a time on the idle server, formats interleaved), and its p50 "
                  "over pcm's (target: at most 0.1 s).", "", "| format | first byte p50 s | over pcm s |",
                  "|---|---|---|"]
        for fmt, v in first["formats"].items():
            lines.append(f"| {fmt} | {_f(v['p50_s'])} | {_f(first['gap_p50_s'].get(fmt))} |")
    return lines


def _f(v: Any, digits: int = 3) -> str:
    return f"{v:.{digits}f}" if isinstance(v, float) else ("–" if v is None else str(v))
