"""Structured logs: one JSON object per line and event.

Every line has ``ts`` (UTC ISO 8601), ``level``, ``event``, ``model`` and, for request
events, ``request_id`` (the client's Triton request id, or one generated at the entry
model and propagated to the engine), ``stage``, durations with unit suffixes and ``status``.

Plain ``logging`` records (warnings, tracebacks of the models and libraries) go through the
root handler of :func:`configure_root_logging`, formatted as JSON by python-json-logger with
the same keys: ``ts``, ``level``, ``event`` ("log"), ``logger``, ``message`` (and
``exc_info``, and any ``extra`` fields), so that every line our code writes into the Triton
log is one JSON object.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

_LOGGER = logging.getLogger("chattts_serving.events")
_COMPACT = functools.partial(json.dumps, separators=(",", ":"))


def _timestamp(epoch_s: float | None = None) -> str:
    when = dt.datetime.now(dt.timezone.utc) if epoch_s is None else dt.datetime.fromtimestamp(epoch_s, dt.timezone.utc)
    return when.isoformat(timespec="milliseconds")


class JsonLineFormatter(JsonFormatter):
    """A log record as one ASCII JSON line with the event lines' keys: ``ts``, ``level``
    (lowercase), ``event`` ("log"), ``logger``, ``message``, then ``exc_info`` and extras."""

    def __init__(self) -> None:
        super().__init__("{levelname}{name}{message}", style="{", rename_fields={"levelname": "level",
                         "name": "logger"}, json_ensure_ascii=True, json_serializer=_COMPACT)

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        """Fill ``log_data`` for ``record`` (python-json-logger's hook)."""
        super().add_fields(log_data, record, message_dict)
        head = {"ts": _timestamp(record.created), "level": str(log_data.pop("level", "")).lower(),
                "event": log_data.pop("event", "log"), "logger": log_data.pop("logger", record.name),
                "message": log_data.pop("message", "")}
        rest = dict(log_data)
        log_data.clear()
        log_data.update(head)
        log_data.update(rest)


def configure_root_logging(level: str | int = "INFO") -> None:
    """Send the root logger's records to stderr as JSON lines (:class:`JsonLineFormatter`) at
    ``level``; idempotent (a second call only sets the level). Raises ValueError for an
    unknown level name."""
    root = logging.getLogger()
    root.setLevel(level.upper() if isinstance(level, str) else level)
    if not any(isinstance(h.formatter, JsonLineFormatter) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLineFormatter())
        root.addHandler(handler)


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
    record = {"ts": _timestamp(), "level": level, "event": event, **fields}
    return _COMPACT(record, ensure_ascii=True, default=str)


def log_event(event: str, level: str = "info", **fields: Any) -> None:
    """Write one structured line to stderr (which Triton forwards to its log)."""
    _configure()
    _LOGGER.log(logging.getLevelName(level.upper()), event_line(event, level, **fields))
