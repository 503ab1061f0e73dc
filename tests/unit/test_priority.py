"""The engine's niceness (profile ``[engine] nice``) in process: ``lower_priority`` reaches every
thread of its process, those started later too, and refuses values outside 0-19. In a real
server's ``chattts_gpt`` stub: tests/server/test_priority.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


