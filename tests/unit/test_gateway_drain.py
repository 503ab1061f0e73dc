"""The drain's state without a server (``chattts_serving/gateway/drain.py``): which waits the
drain's start cancels and which its expiry does, and the ``--drain-timeout-s`` setting. The drain
of a real gateway process: tests/server/test_gateway_drain.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from chattts_serving.gateway.__main__ import parse_args, settings_from_args
from chattts_serving.gateway.drain import Drain
from chattts_serving.gateway.settings import GatewaySettings


def test_the_start_ends_idle_waits_and_the_expiry_ends_streams() -> None:
    async def main() -> list[str]:
        drain = Drain()
        ended: list[str] = []

        async def wait(name: str, scope_of: str) -> None:
            with getattr(drain, scope_of)() as scope:
                await anyio.sleep(60)
            if scope.cancelled_caught:
                ended.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "idle", "idle")
            tg.start_soon(wait, "stream", "active")
            await anyio.sleep(0.05)
            drain.begin()
            await anyio.sleep(0.05)
            assert drain.draining and ended == ["idle"]
            drain.expire()
        with drain.idle() as late_idle, drain.active() as late_stream:  # entered after: cancelled at once
            await anyio.sleep(60)
        assert late_idle.cancelled_caught or late_stream.cancelled_caught
        return ended

    assert anyio.run(main) == ["idle", "stream"]


def test_settled_waits_for_streams_and_connections() -> None:
    async def main() -> tuple[bool, bool]:
        live = {"streams": 1}
        drain = Drain(lambda: live["streams"])
        with drain.connection():
            live["streams"] = 0
            busy = await drain.settled(0.1)
        return busy, await drain.settled(0.1)

    assert anyio.run(main) == (False, True)


def test_drain_timeout_is_a_flag_and_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GatewaySettings().drain_timeout_s == 30.0
    monkeypatch.setenv("CHATTTS_GATEWAY_DRAIN_TIMEOUT_S", "12.5")
    assert settings_from_args(parse_args([])).drain_timeout_s == 12.5
    assert settings_from_args(parse_args(["--drain-timeout-s", "0"])).drain_timeout_s == 0
    with pytest.raises(ValueError, match="drain_timeout_s"):
        GatewaySettings(drain_timeout_s=-1)


def test_the_server_moves_its_start_up_heap_out_of_the_collectors_sight() -> None:
    """After uvicorn's startup the gateway process freezes what exists (``gc.freeze``): a full
    collection during a burst of requests then scans only what the requests made, not the
    modules and the app (each such collection paused every request in flight)."""
    import gc
    import socket

    import uvicorn

    from chattts_serving.gateway.drain import DrainingServer

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # a lifespan and nothing else
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    async def main() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = DrainingServer(uvicorn.Config(app, log_level="error"), Drain(), 1.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(30):  # only a hang: never a timing claim
                while not server.started:
                    await anyio.sleep(0.01)
            frozen = gc.get_freeze_count()
            server.should_exit = True
        sock.close()
        return frozen

    gc.unfreeze()
    try:
        frozen = anyio.run(main)
    finally:
        gc.unfreeze()  # the test process's heap is not the gateway's
    assert frozen > 1000, frozen
