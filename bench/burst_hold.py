"""The held load of a saturated burst: long streams and ``chattts_offline`` requests that take
every slot, kept running by a process of its own (:func:`hold_main`) so that their audio is
other users' work, not the measuring client's; and when they count as accepted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from chattts_serving import contract
from chattts_serving.client.common import SynthesisRequest

from .burst_send import BurstResult, infer_channel, send_offline, send_stream

QUEUED_GAUGE = "tts_request_queue_size"
"""The entry model's gauge of accepted streams that have not produced audio yet."""


def _accepted_waiting(metrics_url: str) -> int:
    """Accepted streams of ``contract.MODEL_STREAM`` without audio yet, from Triton's metrics."""
    from .serverload import scrape

    return round(sum(v for (name, labels), v in scrape(metrics_url).items()
                     if name == QUEUED_GAUGE and dict(labels).get("model") == contract.MODEL_STREAM))


OFFLINE_HOLD_TOKENS = 1024
"""Tokens of each held chattts_offline request: enough for it to hold its offline slot through
every burst (the engine admits it ahead of the waiting streams and decodes it in about 2
minutes of full-size steps on 2 cores; a held request that ended would leave a gap a burst
request could take). chattts_offline has no client cancel, so it runs to its end after the
bursts too."""

HOLD_TIMEOUT_S = 3600.0
"""Client deadline of the held streams and offline requests: they are meant to last until the
bursts end (then they are cancelled), however long a slow host makes the phase. With the
bench's 600 s they ended before the last bursts on 2 slow cores (make bench at f18910e), and
the phase no longer measured a saturated server."""

OFFLINE_RETRY_S = 0.5
"""Pause before a keeper sends again after its held request was refused (Triton picked a full
instance) or ended."""

OFFLINE_ACCEPTED_AFTER_S = 0.5
"""A held chattts_offline request still unanswered this long after its send counts as holding
its slot: a refusal comes in milliseconds, and an accepted one sends nothing until it ends
(the entry's queue gauge cannot tell: each instance's stub sets the same series)."""


async def _keep_offline_slot(channel: Any, text: str, index: int, timeout_s: float, go: asyncio.Event,
                             in_flight: dict[int, float]) -> None:
    """Keep one chattts_offline slot taken (on ``channel``, :func:`infer_channel`): send a long
    request and send again whenever it ends (refused "busy" by an instance that is full while
    the other has room: Triton picks the instance; or done), until cancelled.
    ``in_flight[index]`` is the send time of the unanswered request (perf_counter seconds)."""
    n = 0
    while True:
        n += 1
        in_flight[index] = time.perf_counter()
        try:
            await send_offline(channel, SynthesisRequest(text=text, max_new_tokens=OFFLINE_HOLD_TOKENS,
                                                        min_new_tokens=OFFLINE_HOLD_TOKENS,
                                                        request_id=f"hold-offline-{index}-{n}"), go, timeout_s)
        finally:
            in_flight.pop(index, None)
        await asyncio.sleep(OFFLINE_RETRY_S)


def hold_main(url: str, hold: int, hold_tokens: int, text: str, timeout_s: float, streaming: Any,
               running: Any, stop: Any, offline_hold: int = 0, offline_held: Any = None) -> None:
    """The held streams, in their own process: ``hold`` long streams and ``offline_hold``
    chattts_offline requests kept running (:func:`_keep_offline_slot`); ``streaming`` (shared
    int) counts the streams that have sent audio or ended, ``running`` those not ended,
    ``offline_held`` the offline requests unanswered for :data:`OFFLINE_ACCEPTED_AFTER_S`; all
    are cancelled once ``stop`` (a multiprocessing event) is set."""
    import tritonclient.grpc.aio as aio

    async def main() -> None:
        conns = [aio.InferenceServerClient(url) for _ in range(hold)]
        offline_conns = [infer_channel(url) for _ in range(offline_hold)]
        go = asyncio.Event()
        go.set()
        outs = [BurstResult() for _ in range(hold)]
        in_flight: dict[int, float] = {}
        held = [SynthesisRequest(text=text, max_new_tokens=hold_tokens, min_new_tokens=hold_tokens,
                                 request_id=f"hold-{i}") for i in range(hold)]
        tasks = [asyncio.create_task(send_stream(c, held[i], go, timeout_s, outs[i])) for i, c in enumerate(conns)]
        keepers = [asyncio.create_task(_keep_offline_slot(c, text, i, timeout_s, go, in_flight))
                   for i, c in enumerate(offline_conns)]
        try:
            while not stop.is_set():
                streaming.value = sum(1 for o in outs if o.first_s is not None or o.kind)
                running.value = sum(1 for t in tasks if not t.done())
                if offline_held is not None:
                    now = time.perf_counter()
                    offline_held.value = sum(1 for t in list(in_flight.values()) if now - t >= OFFLINE_ACCEPTED_AFTER_S)
                await asyncio.sleep(0.05)
            running.value = sum(1 for t in tasks if not t.done())
        finally:
            for t in tasks + keepers:
                t.cancel()
            await asyncio.gather(*tasks, *keepers, return_exceptions=True)
            await asyncio.gather(*(c.close() for c in conns + offline_conns), return_exceptions=True)

    asyncio.run(main())


def held_accepted(streaming: int, hold: int, metrics_url: str | None) -> bool:
    """Every one of ``hold`` held streams has sent audio or ended (``streaming`` of them) or,
    with ``metrics_url``, is accepted and waiting."""
    if streaming >= hold:
        return True
    return metrics_url is not None and streaming + _accepted_waiting(metrics_url) >= hold
