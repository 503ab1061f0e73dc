"""The engine's niceness (profile ``[engine] nice``): every thread of its process, in process
and in a real server's ``chattts_gpt`` stub."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.serving.profile import load_profile
from tests.support.servers import Server, stub_processes

CHILD = """
import os, threading
from chattts_serving.triton.setup import lower_priority
started = threading.Event(); stop = threading.Event()
def idle():
    started.set(); stop.wait()
before = threading.Thread(target=idle); before.start(); started.wait()
changed = lower_priority(TARGET)
after = threading.Thread(target=stop.wait); after.start()
nices = sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir('/proc/self/task')})
assert lower_priority(TARGET - 1) == 0  # never lowers a value (an unprivileged process cannot)
stop.set(); before.join(); after.join()
print(changed, nices)
"""


def _thread_nices(proc: Any) -> set[int]:
    """Niceness of every thread of ``proc`` (a ``psutil.Process``)."""
    return {os.getpriority(os.PRIO_PROCESS, t.id) for t in proc.threads()}


def test_lower_priority_covers_every_thread_and_those_started_later() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the child inherits it (a niced CI runner: above 0)
    if own >= 19:
        pytest.skip("this process already runs at niceness 19: nothing left to lower")
    target = max(7, own + 1)
    out = subprocess.run([sys.executable, "-c", CHILD.replace("TARGET", str(target))], capture_output=True,
                         text=True, check=True).stdout.split(maxsplit=1)
    assert int(out[0]) >= 2  # the main thread and the one started before
    assert out[1].strip() == f"[{target}]"


def test_lower_priority_refuses_values_outside_0_to_19() -> None:
    from chattts_serving.triton.setup import lower_priority

    for bad in (-1, 20):
        with pytest.raises(ValueError, match="0-19"):
            lower_priority(bad)


@pytest.mark.server
def test_the_served_engine_runs_at_the_profiles_niceness(triton_server: Server) -> None:
    """Every thread of the server's chattts_gpt stub has the profile's niceness; the entry
    model's stub keeps the niceness it was started with (its admission and refusals must not
    wait): that of tritonserver, its parent (not this test process's, which an in-process
    engine test may have lowered since the server started)."""
    stubs = stub_processes(triton_server)
    entry = contract.MODEL_STREAM_ENTRY  # the Python entry model, behind the gate (in the server process)
    assert {contract.MODEL_ENGINE, entry} <= stubs.keys(), stubs
    nice, own = load_profile("cpu").engine.nice, os.getpriority(os.PRIO_PROCESS, stubs[entry].ppid())
    assert nice > 0
    assert _thread_nices(stubs[contract.MODEL_ENGINE]) == {max(nice, own)}
    assert _thread_nices(stubs[entry]) == {own}
