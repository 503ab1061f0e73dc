"""The overload burst: many clients send one stream request at the same moment.

``clients`` gRPC clients (one channel each, connected and warmed first) each open a stream to
``chattts`` and then, all at one start signal, send one request on it; the server admits as
many as it has stream slots and must refuse the rest with an explicit "busy" error at once.
Measured from each request's send (the moment gRPC takes the request message to write it on its
open stream): the time to its refusal (busy) or to its first audio (accepted), every refusal's
kind, and whether every request ended (audio then final response, or one error); also from the
start signal (``busy_p99_s_from_start``: what one load-generating process adds by sending 200
requests itself). ``rounds`` bursts run one after another on the same server (with ``hold``,
the same held streams, opened by a process of their own: their audio is other users' work,
not the measuring client's) and are pooled. ``make bench`` runs it as a phase (``bench.phases``):
on an idle server and with every stream slot held by long streams (the client then at niceness
:data:`CLIENT_NICE` where allowed: ``client_nice`` in the summary), written into ``bench.json`` as
``busy_p99_s_burst`` and ``busy_p99_s_saturated`` (issue: at most 0.1 s on 2 cores with every
slot taken by full-size streams), the whole summaries, accepted streams' TTFA and each round's
busy p99 included, under ``burst.burst`` and ``burst.saturated``.

The offline door (``chattts_offline``, one unary infer call per request, each client on a gRPC
channel of its own made and warmed first) is timed on the same footing: from the moment gRPC
takes the request's bytes to start the call (:func:`~bench.burst_send.send_offline`), the request built before the
start signal. gRPC's global subchannel pool carries a process's channels to one server, with
the same options, on one HTTP/2 connection: the 200 clients are 200 channels and 200 calls or
streams, not 200 TCP connections.

Each door's request is in :mod:`bench.burst_send`, the held load in :mod:`bench.burst_hold`;
this module runs the rounds, pools them and prints the summary.

``python -m bench.burst --url 127.0.0.1:8001 --clients 200`` runs it against a
running server and prints the JSON summary (``--doors stream,offline,gateway --gateway-url ...
--offline-hold 16`` for the other doors, as ``make bench`` runs them saturated: the offline and
gateway rows of its report and ``busy_p99_s_offline_saturated``, ``busy_p99_s_gateway_saturated``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

from chattts_serving.client.common import SynthesisRequest
from chattts_serving.errors import ErrorKind

from .burst_hold import HOLD_TIMEOUT_S, OFFLINE_HOLD_TOKENS, held_accepted, hold_main
from .burst_send import BurstResult, connect_channel, infer_channel, send_gateway, send_offline, send_stream
from .stats import percentile

DEFAULT_TEXT = "今天天气很好，我们一起去公园散步吧。"


CLIENT_NICE = -10
"""Niceness the burst client asks for while it measures a saturated server (``make bench``;
granted to root only, else it keeps its own)."""


def _set_nice(nice: int) -> None:
    """Every thread of this process at niceness ``nice`` (Linux keeps one per thread); raises
    OSError where the OS refuses (lowering it needs root)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


@contextlib.contextmanager
def _priority(nice: int | None) -> Iterator[int]:
    """Run the block at niceness ``nice`` (None: unchanged) if the OS allows it (root), else at
    the current one; yields the niceness in effect and restores the old one after."""
    old = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):  # an unprivileged process cannot lower its niceness
        if nice is not None:
            _set_nice(nice)
    try:
        yield os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        with contextlib.suppress(OSError):
            _set_nice(old)


DOORS: Final = ("stream", "offline", "gateway")
"""Where a burst's requests go: ``chattts`` streams over gRPC, ``chattts_offline`` infer calls
over gRPC, or ``POST /v1/audio/speech`` through the OpenAI gateway (HTTP)."""


async def run_burst(url: str, clients: int, tokens: int, text: str = DEFAULT_TEXT, timeout_s: float = 600.0,
                    hold: int = 0, hold_tokens: int = 2048, metrics_url: str | None = None,
                    hold_wait_s: float = 120.0, rounds: int = 1, pause_s: float = 1.0,
                    client_nice: int | None = None, offline_hold: int = 0, doors: Sequence[str] = ("stream",),
                    gateway_url: str | None = None) -> dict[str, Any]:
    """Connect ``clients`` clients, then send one request each at the same moment (``tokens`` new
    tokens each), ``rounds`` times, ``pause_s`` seconds apart (each round waits until all its
    requests have ended); the summary pools the rounds. With ``hold``, first start that many
    long streams (``hold_tokens`` each) in another process (their clients are other users: their
    audio is not this client's work) and wait until each has been accepted, so that the bursts
    meet a server already saturated; they are cancelled after the last. A held stream counts as
    accepted once it has sent audio or, with ``metrics_url`` (Triton's ``/metrics``), as soon as
    the server counts it among its accepted streams waiting for audio (the engine decodes at
    most its batch size at once: the rest of the held streams wait there without audio). With
    ``offline_hold``, that process also keeps that many chattts_offline requests running (every
    offline slot: ``entry.offline_threads``) and the bursts
    wait until all are unanswered for :data:`~bench.burst_hold.OFFLINE_ACCEPTED_AFTER_S`.
    Waits at most ``hold_wait_s`` seconds (``hold_ready`` in the summary says whether every one
    was accepted).

    ``doors`` (of :data:`DOORS`) says where the bursts go; the doors take turns, round by round
    (a door's rounds all after another's met another stretch of the saturated phase: the
    held requests' progress, the host's other load), the first door's summary is the top level
    of the result, every other's is under its name
    (``gateway`` needs ``gateway_url``, the gateway's base URL; its summary adds
    ``busy_with_retry_after``, the refusals that carried a ``Retry-After`` header).

    The client stands for 200 machines but shares the server's cores. With ``client_nice``
    (``make bench`` passes :data:`CLIENT_NICE` for the saturated bursts) it runs the bursts at
    that niceness where the OS grants it (``client_nice`` in the summary is the one in effect),
    so that what it measures is the server's delay rather than its own wait for a core that a
    saturated server keeps busy. Where bursts are accepted, it also receives their audio:
    raised, it would take the cores from the streams whose TTFA it measures. Returns the
    summary (see the module docstring). Raises ValueError for rounds below 1, an unknown door,
    or a gateway door without ``gateway_url``."""
    import multiprocessing as mp

    import tritonclient.grpc.aio as aio

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not doors or set(doors) - set(DOORS):
        raise ValueError(f"doors must be some of {DOORS}, got {tuple(doors)}")
    if "gateway" in doors and not gateway_url:
        raise ValueError("the gateway door needs gateway_url")
    conns = [aio.InferenceServerClient(url) for _ in range(clients)]
    channels = [infer_channel(url) for _ in range(clients)] if "offline" in doors else []
    hold_ready: bool | None = None
    pooled: dict[str, list[BurstResult]] = {d: [] for d in doors}
    round_p99: dict[str, list[float | None]] = {d: [] for d in doors}
    round_order: list[bool | None] = []
    ctx = mp.get_context("spawn")
    streaming, running, offline_held, stop = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0), ctx.Event()
    holder = (ctx.Process(target=hold_main, args=(url, hold, hold_tokens, text, max(timeout_s, HOLD_TIMEOUT_S),
                                                  streaming, running, stop, offline_hold, offline_held),
                          name="burst-hold", daemon=True) if hold or offline_hold else None)
    try:
        await asyncio.gather(*(c.is_server_live() for c in conns),  # every channel connected
                             *(connect_channel(c) for c in channels))
        if holder is not None:
            holder.start()  # before the priority changes: the held streams keep the default one
            give_up = time.perf_counter() + hold_wait_s
            while not (hold_ready := held_accepted(streaming.value, hold, metrics_url)
                       and offline_held.value >= offline_hold) \
                    and time.perf_counter() < give_up and holder.is_alive():
                await asyncio.sleep(0.1)
        with _priority(client_nice) as nice_in_effect:
            for r in range(rounds):  # the doors take turns, so that the phase's drift meets each alike
                for door in doors:
                    if r or door != doors[0]:
                        await asyncio.sleep(pause_s)
                    targets: list[Any] = ([gateway_url] * clients if door == "gateway" else
                                          channels if door == "offline" else conns)
                    outcomes = await _round(_SENDERS[door], targets, tokens, text, timeout_s, tag=f"{door}-{r}")
                    pooled[door].extend(outcomes)
                    one = summarize(outcomes)
                    round_p99[door].append(one["busy_p99_s"])
                    if door == doors[0]:
                        round_order.append(one["busy_before_first_accepted_end"])
    finally:
        if holder is not None and holder.pid is not None:
            stop.set()
            await asyncio.to_thread(holder.join, 30.0)
            if holder.is_alive():
                holder.terminate()
        await asyncio.gather(*(c.close() for c in conns + channels), return_exceptions=True)
    summary = summarize(pooled[doors[0]])
    known = [v for v in round_order if v is not None]  # each round's refusals against its own accepted ends
    summary.update({"door": doors[0], "rounds": rounds, "round_busy_p99_s": round_p99[doors[0]],
                    "busy_before_first_accepted_end": all(known) if known else None, "client_nice": nice_in_effect})
    for door in doors[1:]:
        summary[door] = {**summarize(pooled[door]), "rounds": rounds, "round_busy_p99_s": round_p99[door]}
    if "gateway" in doors:
        gw = summary if doors[0] == "gateway" else summary["gateway"]
        busy = [o for o in pooled["gateway"] if o.kind == ErrorKind.BUSY]
        gw["busy_with_retry_after"] = sum(1 for o in busy if o.retry_after is not None)
    if hold or offline_hold:
        summary.update({"hold": hold, "hold_tokens": hold_tokens, "hold_ready": hold_ready,
                        "held_running_at_end": running.value})
    if offline_hold:
        summary.update({"offline_hold": offline_hold, "offline_hold_tokens": OFFLINE_HOLD_TOKENS,
                        "offline_held_at_end": offline_held.value})
    return summary


async def _round(send: Any, targets: list[Any], tokens: int, text: str, timeout_s: float,
                 tag: str) -> list[BurstResult]:
    """One burst: each of ``targets`` (a tritonclient gRPC client for the stream door, a gRPC
    channel of :func:`infer_channel` for the offline door, or the gateway's URL) gets ready to send
    (``send``: :func:`send_stream`, :func:`send_offline` or :func:`send_gateway`), then one request
    is sent on each at once. The client's garbage collector is off during the round, after a
    collection at the start line: a full collection of the clients' objects inside a round
    timed every answer that arrived meanwhile late by its length (docs/performance.md, "The
    one slow burst in five was the benchmark client's")."""
    start = asyncio.Event()
    outs = [BurstResult() for _ in targets]
    tasks = [asyncio.create_task(send(t, SynthesisRequest(text=text, max_new_tokens=tokens, min_new_tokens=tokens,
                                                          request_id=f"{tag}-{i}"), start, timeout_s, outs[i]))
             for i, t in enumerate(targets)]
    await asyncio.sleep(0.2)  # every stream open (every gateway connection made), waiting at the start line
    gc.collect()
    gc.disable()
    try:
        start_at = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
    finally:
        gc.enable()
    for o in outs:
        o.sent_after_start_s = o.sent_at - start_at if o.sent_at else None
    return outs


_SENDERS: Final = {"stream": send_stream, "offline": send_offline, "gateway": send_gateway}


def summarize(outcomes: list[BurstResult]) -> dict[str, Any]:
    """Counts by outcome, busy-refusal latency and accepted streams' TTFA (s): p50, p99, max."""
    busy = [o.first_s for o in outcomes if o.kind == ErrorKind.BUSY and o.first_s is not None]
    busy_from_start = [o.first_s + o.sent_after_start_s for o in outcomes
                       if o.kind == ErrorKind.BUSY and o.first_s is not None and o.sent_after_start_s is not None]
    ok = [o for o in outcomes if o.kind is None and o.end_s is not None]
    ttfa = [o.first_s for o in ok if o.first_s is not None]
    kinds: dict[str, int] = {}
    for o in outcomes:
        kinds[o.kind or "ok"] = kinds.get(o.kind or "ok", 0) + 1
    first_final = min((o.end_s for o in ok if o.end_s is not None), default=None)
    return {
        "requests": len(outcomes), "outcomes": kinds,
        "lost": sum(1 for o in outcomes if o.end_s is None and o.kind is None),
        "busy_p50_s": percentile(busy, 50) if busy else None, "busy_p99_s": percentile(busy, 99) if busy else None,
        "busy_max_s": max(busy) if busy else None,
        "busy_p99_s_from_start": percentile(busy_from_start, 99) if busy_from_start else None,
        "busy_before_first_accepted_end": (all(b <= first_final for b in busy)
                                           if busy and first_final is not None else None),
        "accepted_ttfa_p50_s": percentile(ttfa, 50) if ttfa else None,
        "accepted_ttfa_p99_s": percentile(ttfa, 99) if ttfa else None,
        "messages": sorted({o.message for o in outcomes if o.kind and o.kind != ErrorKind.BUSY})[:5],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--hold", type=int, default=0, help="long streams started (and accepted) before the burst")
    ap.add_argument("--rounds", type=int, default=1, choices=range(1, 1001), metavar="N",
                    help="bursts one after another (1 to 1000), pooled in the summary")
    ap.add_argument("--metrics-url", default=None,
                    help="Triton's metrics, e.g. http://127.0.0.1:8002/metrics: held streams count as accepted "
                         "while they wait for the engine (else only once they send audio)")
    ap.add_argument("--client-nice", type=int, default=None,
                    help=f"niceness of the client during the bursts (root only below 0; make bench: {CLIENT_NICE} "
                         "with --hold)")
    ap.add_argument("--offline-hold", type=int, default=0,
                    help="chattts_offline requests kept running meanwhile (needs --metrics-url; make bench: every "
                         "offline slot)")
    ap.add_argument("--doors", default="stream",
                    help=f"comma-separated, of {','.join(DOORS)}: where the bursts go, one door after the other")
    ap.add_argument("--gateway-url", default=None, help="the gateway's base URL (door gateway), e.g. http://127.0.0.1:8080")
    args = ap.parse_args(argv)
    try:
        summary = asyncio.run(run_burst(args.url, args.clients, args.tokens, args.text, hold=args.hold,
                                        metrics_url=args.metrics_url, rounds=args.rounds, client_nice=args.client_nice,
                                        offline_hold=args.offline_hold, doors=tuple(args.doors.split(",")),
                                        gateway_url=args.gateway_url))
    except ValueError as exc:
        ap.error(str(exc))
    json.dump(summary, sys.stdout, indent=1, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
