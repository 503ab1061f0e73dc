"""The engine's cancel socket (chattts_serving/triton/compat/cancels.py) in process: a listener hears
each stream id the entry models send, per-server addresses, a taken address, a failing cancel.
The cancel storm on a real server: tests/server/test_cancels.py."""

from __future__ import annotations

import os
import queue
import time

import pytest

from chattts_serving.triton.compat.cancels import CancelListener, cancel_address, send_cancel


def _address(tag: str) -> str:
    return cancel_address(f"test-engine-{tag}", server_pid=os.getpid())


def test_a_listener_hears_each_stream_id_and_stops_on_close() -> None:
    heard: queue.Queue[str] = queue.Queue()
    address = _address("hears")
    listener = CancelListener(address, heard.put).start()
    try:
        ids = [f"{i:032x}" for i in range(50)]
        assert all(send_cancel(address, i) for i in ids)
        assert [heard.get(timeout=5) for _ in ids] == ids
    finally:
        listener.close()
    assert listener._thread is not None and not listener._thread.is_alive()
    assert send_cancel(address, "late") is False  # nothing listens any more: the caller falls back


def test_nothing_listening_is_false_not_an_error_and_addresses_are_per_server_and_engine() -> None:
    assert send_cancel(_address("nobody"), "abc") is False
    assert cancel_address("m", 1) != cancel_address("m", 2) != cancel_address("n", 2)
    assert cancel_address("m").startswith("\0")  # abstract namespace: no file left behind
    assert str(os.getppid()) in cancel_address("m")  # a stub's parent is its tritonserver


def test_a_taken_address_raises_at_start_and_a_failing_cancel_does_not_stop_the_listener() -> None:
    address = _address("taken")
    calls: list[str] = []

    def cancel(stream_id: str) -> None:
        calls.append(stream_id)
        if stream_id == "boom":
            raise RuntimeError("engine said no")

    listener = CancelListener(address, cancel).start()
    try:
        with pytest.raises(OSError):
            CancelListener(address, cancel).start()
        assert send_cancel(address, "boom") and send_cancel(address, "after")
        end = time.monotonic() + 5
        while len(calls) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        assert calls == ["boom", "after"]
    finally:
        listener.close()


