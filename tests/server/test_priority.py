"""The engine's niceness (profile ``[engine] nice``) on a real tritonserver: every thread of its
``chattts_gpt`` stub runs at the profile's niceness, the entry model's stub at tritonserver's.
In process: tests/unit/test_priority.py."""

from __future__ import annotations

import os
from typing import Any

from chattts_serving import contract
from chattts_serving.serving.profile import load_profile
from tests.support.servers import Server, stub_processes


def _thread_nices(proc: Any) -> set[int]:
    """Niceness of every thread of ``proc`` (a ``psutil.Process``)."""
    return {os.getpriority(os.PRIO_PROCESS, t.id) for t in proc.threads()}


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
