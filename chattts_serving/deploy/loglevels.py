"""The error lines every start of Triton 2.51 logs on a host without a CUDA driver, re-levelled.

The bundled tritonserver is a GPU build. On a host with no CUDA driver it logs, at error level,
``CudaDriverHelper has not been initialized.`` (the CUDA block manager for implicit state,
created at every start: core ``server.cc``) and ``unable to create stream for <ensemble>: CUDA
driver version is insufficient ...`` (every ensemble's scheduler creates a CUDA stream: core
``ensemble_scheduler.cc``). Neither is behind any flag or config, and the server works without
both. :func:`relevel` turns exactly those two lines into info lines and passes every other line
unchanged; :class:`~chattts_serving.deploy.server.TritonServer` runs this module as a filter
between the server and its log only when the host has no CUDA driver
(:func:`cuda_driver_present`), where no GPU can be used at all (docs/triton-workarounds.md,
"CUDA errors on a CPU host"). Standard library only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import signal
import sys
from typing import BinaryIO

CPU_HOST_ERRORS = (
    re.compile(rb'E\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ server\.cc:\d+\] '
               rb'"CudaDriverHelper has not been initialized\."\r?\n?'),
    re.compile(rb'E\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ensemble_scheduler\.cc:\d+\] "unable to create stream for [^"]+: '
               rb'CUDA driver version is insufficient for CUDA runtime version"\r?\n?'),
)
"""Triton's lines (level letter ``E``, then date, time, thread, source) that a host without a
CUDA driver always gets, matched whole."""


def relevel(line: bytes) -> bytes:
    """``line`` with its level letter made ``I`` when it is one of :data:`CPU_HOST_ERRORS`;
    otherwise ``line`` unchanged."""
    if line[:1] == b"E" and any(p.fullmatch(line) for p in CPU_HOST_ERRORS):
        return b"I" + line[1:]
    return line


def cuda_driver_present() -> bool:
    """Whether this host's CUDA driver library loads (a GPU host): there the lines are real."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def copy(src: BinaryIO, dst: BinaryIO) -> None:
    """Copy ``src`` to ``dst`` line by line until its end, re-levelled, each line flushed at once
    (the log is read while the server runs)."""
    for line in iter(src.readline, b""):
        dst.write(relevel(line))
        dst.flush()


def filter_command() -> list[str]:
    """The command that runs :func:`copy` from stdin to stdout in a process of its own."""
    return [sys.executable, "-m", __name__]


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the filter ends at the end of its input, never before
    with contextlib.suppress(BrokenPipeError):  # nobody reads the output any more
        copy(sys.stdin.buffer, sys.stdout.buffer)
