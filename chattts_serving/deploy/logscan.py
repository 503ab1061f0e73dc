"""Signs in a tritonserver log that the server process or one of its model processes crashed or
found its heap corrupted: one definition for the supervisor, the soak, the benchmark and the
test fixtures, which all fail loudly on any of them.

A sign is a plain-text line (the server's structured JSON lines are ours and never one)
matching one of :data:`FATAL_PATTERNS`: a fatal signal (``Signal (N)`` for any N but the stop
signals 2 and 15, which every normal stop prints), glibc's heap checks (``malloc(): ...``,
``free(): ...``, ``double free``, ``corrupted ...``), a Python stub's fatal error or
segmentation fault, an uncaught C++ exception, or a sanitizer's report.
"""

from __future__ import annotations

import re
from pathlib import Path

FATAL_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"Signal \((?!2\)|15\))\d+\)",
    r"\bmalloc(_consolidate)?\(\)",
    r"\bfree\(\)",
    r"double free",
    r"corrupted",
    r"Fatal Python error",
    r"Segmentation fault",
    r"terminate called",
    r"ERROR: AddressSanitizer",
    r"runtime error: ",  # UndefinedBehaviorSanitizer
))


def fatal_lines(text: str) -> list[str]:
    """The lines of ``text`` (a server log) that are signs of a crash, in order."""
    return [line for line in text.splitlines()
            if not line.startswith('{"') and any(p.search(line) for p in FATAL_PATTERNS)]


class LogScanner:
    """Reads a growing log file from where it last stopped; :meth:`new_fatal_lines` returns the
    signs written since the last call (a line cut at the end of the file waits for its end)."""

    def __init__(self, path: Path | None, start_at_end: bool = False) -> None:
        self.path = path
        self.offset = path.stat().st_size if (start_at_end and path is not None and path.is_file()) else 0

    def new_fatal_lines(self) -> list[str]:
        if self.path is None or not self.path.is_file():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return fatal_lines(data[:end].decode(errors="replace"))
