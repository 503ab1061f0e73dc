"""Structured logs: one JSON object per line and event.

Every line has ``ts`` (UTC ISO 8601), ``level``, ``event``, ``model`` and, for request
events, ``request_id`` (the client's Triton request id, or one generated at the entry
model and propagated to the engine), ``stage``, durations with unit suffixes and ``status``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any

_LOGGER = logging.getLogger("chattts_serving.events")


def _configure() -> None:
    if getattr(_LOGGER, "_chattts_configured", False):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    _LOGGER._chattts_configured = True  # type: ignore[attr-defined]


def event_line(event: str, level: str = "info", **fields: Any) -> str:
    """The JSON line for ``event`` with ``fields`` (non-JSON values are stringified). Pure
    ASCII (``\\uXXXX`` escapes): a stub's stderr may not be UTF-8, and Python would then write
    characters outside the BMP as ``\\U`` escapes that are not JSON."""
    record = {"ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"), "level": level,
              "event": event, **fields}
    return json.dumps(record, ensure_ascii=True, default=str, separators=(",", ":"))


def log_event(event: str, level: str = "info", **fields: Any) -> None:
    """Write one structured line to stderr (which Triton forwards to its log)."""
    _configure()
    _LOGGER.log(logging.getLevelName(level.upper()), event_line(event, level, **fields))
