"""Load for the deploy tests: closed-loop gRPC streams through the balancer, one outcome each.

:class:`Load` runs ``concurrency`` workers in an asyncio loop on a thread of its own (the test
kills, drains and restarts replicas meanwhile); each worker sends its next stream
(:class:`~chattts_serving.client.aio.AioStreamClient`, one channel, every stream a gRPC call
that the balancer places on its own) as soon as its previous one ended. Every request gets one
:class:`Outcome`: ``completed`` (its final response came), ``error`` (the server or the
transport ended it with an explicit error: its kind and message are kept) or ``lost`` (the
client gave up waiting: no response for the idle timeout, or still unfinished when the run was
collected). No request is retried: what the fleet does is counted as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from chattts_serving.client.aio import AioStreamClient
from chattts_serving.client.common import TIMEOUT, ClientError, SynthesisRequest

TEXT = "你好，今天天气很好。"
IDLE_TIMEOUT_S = 65.0
"""A client's longest wait for the next response, seconds: just past the entry model's stall
timeout (60 s), after which the server would have ended the stream itself."""


def request(tokens: int, seed: int = 1) -> SynthesisRequest:
    """A stream of exactly ``tokens`` tokens (``tokens`` x 512 samples at 24 kHz)."""
    return SynthesisRequest(text=TEXT, seed=seed, max_new_tokens=tokens, min_new_tokens=tokens)


@dataclass
class Outcome:
    """One request: when it was sent, its first audio and its end arrived (monotonic seconds),
    ``result`` (completed, error, lost, cancelled), the error's ``kind``, transport ``status`` and
    ``message``."""

    sent: float
    first_audio: float | None = None
    ended: float | None = None
    result: str = "lost"
    kind: str | None = None
    status: str | None = None
    message: str = ""


async def stream_once(client: AioStreamClient, tokens: int, seed: int,
                      record: Callable[[Outcome], None]) -> Outcome:
    """One stream of ``tokens`` tokens; its :class:`Outcome`, handed to ``record`` as it is sent
    (so that one never answered is counted too) and filled in as it ends."""
    out = Outcome(sent=time.monotonic())
    record(out)
    try:
        async with contextlib.aclosing(client.stream(request(tokens, seed), idle_timeout_s=IDLE_TIMEOUT_S)) as parts:
            async for part in parts:
                if part.audio.size and out.first_audio is None:
                    out.first_audio = time.monotonic()
        out.result = "completed"
    except asyncio.CancelledError:
        out.result, out.ended = "cancelled", time.monotonic()
        raise
    except ClientError as exc:
        out.result = "lost" if exc.status == TIMEOUT else "error"
        out.kind = exc.kind.value if exc.kind is not None else None
        out.status = None if exc.status is None else str(exc.status)
        out.message = exc.message[:300]
    out.ended = time.monotonic()
    return out


@dataclass
class Load:
    """``concurrency`` closed-loop streams of ``tokens`` tokens to ``url`` until :meth:`stop`."""

    url: str
    concurrency: int
    tokens: int
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deploy-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # cancel(): the streams were cancelled
            self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _one(self, client: AioStreamClient, seed: int) -> None:
        await stream_once(client, self.tokens, seed, self.outcomes.append)

    async def _worker(self, client: AioStreamClient, first_seed: int) -> None:
        seed = first_seed
        while not self._stopping.is_set():
            await self._one(client, seed)
            seed += self.concurrency

    async def _main(self) -> None:
        client = AioStreamClient(self.url)
        try:
            await asyncio.gather(*(self._worker(client, i + 1) for i in range(self.concurrency)))
        finally:
            await client.close()

    def stop(self, grace_s: float = IDLE_TIMEOUT_S + 15) -> list[Outcome]:
        """Send no new request, wait up to ``grace_s`` for those in flight (an unfinished one
        stays ``lost``), and return every outcome."""
        self._stopping.set()
        self._thread.join(grace_s)
        if self._thread.is_alive():
            self.cancel()
        return list(self.outcomes)

    def cancel(self) -> list[Outcome]:
        """Cancel every stream in flight (the server drops them: a client cancel) and return
        every outcome; a cancelled one reads ``cancelled``."""
        self._stopping.set()

        def cancel_all() -> None:  # in the loop's own thread
            for task in asyncio.all_tasks(self._loop):
                task.cancel()

        with contextlib.suppress(RuntimeError):  # the loop has ended already
            self._loop.call_soon_threadsafe(cancel_all)
        self._thread.join(30)
        return list(self.outcomes)

    def wait_completed(self, count: int, timeout_s: float = 120.0) -> None:
        """Block until ``count`` requests of this run have completed."""
        deadline = time.monotonic() + timeout_s
        while sum(o.result == "completed" for o in self.outcomes) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {count} requests completed in {timeout_s:g} s: "
                                     f"{counts(self.outcomes)}")
            time.sleep(0.05)


def one_request(url: str, tokens: int, seed: int = 1) -> Outcome:
    """One stream of ``tokens`` tokens to ``url``, start to end; its outcome."""

    async def main() -> Outcome:
        client = AioStreamClient(url)
        try:
            return await stream_once(client, tokens, seed, lambda _out: None)
        finally:
            await client.close()

    return asyncio.run(main())


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """Requests sent, completed, failed with an explicit error, lost."""
    return {"sent": len(outcomes), "completed": sum(o.result == "completed" for o in outcomes),
            "failed_explicit": sum(o.result == "error" for o in outcomes),
            "lost": sum(o.result == "lost" for o in outcomes)}


async def _ttfa(client: AioStreamClient, tokens: int, seed: int) -> float:
    start = time.monotonic()
    async with contextlib.aclosing(client.stream(request(tokens, seed), idle_timeout_s=IDLE_TIMEOUT_S)) as parts:
        first = None
        async for part in parts:
            if part.audio.size and first is None:
                first = time.monotonic() - start
    assert first is not None, "a stream without audio"
    return first


def ttfa_ratio(direct_url: str, balanced_url: str, rounds: int, tokens: int) -> dict[str, float]:
    """Time to first audio through the balancer over straight to a replica: ``rounds`` pairs of
    single streams, one after the other, direct and balanced alternating in one run (medians)."""

    async def main() -> dict[str, float]:
        direct, balanced = AioStreamClient(direct_url), AioStreamClient(balanced_url)
        try:
            await _ttfa(direct, tokens, 0)  # warm both channels
            await _ttfa(balanced, tokens, 0)
            a, b = [], []
            for i in range(rounds):
                a.append(await _ttfa(direct, tokens, i + 1))
                b.append(await _ttfa(balanced, tokens, i + 1))
        finally:
            await direct.close()
            await balanced.close()
        da, db = statistics.median(a), statistics.median(b)
        return {"rounds": rounds, "ttfa_direct_median_s": round(da, 4), "ttfa_balanced_median_s": round(db, 4),
                "ratio": round(db / da, 3)}

    return asyncio.run(main())
