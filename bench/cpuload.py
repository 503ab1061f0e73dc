"""CPU accounting over a span of the benchmark: this process, the whole machine, the rest.

Other work on the machine (another user's tests, a compiler) skews every number here on a
2-core host; each phase records how busy the rest of the machine was so a skewed run can be
recognised and repeated.
"""

from __future__ import annotations

import time

import psutil


def system_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot: user, nice, system, irq, softirq and
    steal (time the hypervisor gave to others); guest time is already inside user/nice."""
    t = psutil.cpu_times()
    fields = ("user", "nice", "system", "irq", "softirq", "steal")
    return float(sum(getattr(t, f, 0.0) for f in fields))


def process_cpu_s(proc: psutil.Process | None = None) -> float:
    """User + system CPU seconds of ``proc`` (default: this process)."""
    t = (proc or psutil.Process()).cpu_times()
    return float(t.user + t.system)


class CpuWindow:
    """Measures one span: create it at the start, call :meth:`stop` at the end.

    :meth:`stop` returns wall_s, self_cpu_percent (this process), system_cpu_percent (the whole
    machine) and other_cpu_percent (the machine minus this process and ``extra_cpu_s``), each in
    percent of one core (200 = both cores of a 2-core host busy).
    """

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.self0 = process_cpu_s()
        self.sys0 = system_busy_s()

    def stop(self, extra_cpu_s: float = 0.0) -> dict[str, float | None]:
        wall = time.perf_counter() - self.t0
        me = process_cpu_s() - self.self0
        system = system_busy_s() - self.sys0

        def pct(cpu_s: float) -> float | None:
            return 100.0 * cpu_s / wall if wall > 0 else None

        return {"wall_s": wall, "self_cpu_percent": pct(me), "system_cpu_percent": pct(system),
                "other_cpu_percent": pct(max(0.0, system - me - extra_cpu_s))}
