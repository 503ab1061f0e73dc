"""Saved voices: a voice uploaded once (``POST /v1/audio/voices``) and used by name on every
door of every gateway replica that shares the store.

What is stored is what ChatTTS needs, computed once at upload: a reference recording becomes
its audio-prompt codes (the DVAE encoder of the ``chattts_frontend`` model, packed as ChatTTS'
``spk_smp`` string) and its transcript (``txt_smp``); a ``spk_emb`` string or a seed is kept as
it is (checked by the front end first). A request naming a saved voice is sent to Triton with
those inputs (``spk_smp`` + ``reference_text``, ``voice``): the gateway reads the store, the
Triton models never do (they stay stateless and need no database credentials; a client of the
Triton door sends the inputs ``GET /v1/audio/voices/{name}`` returns).

The store is one table (:data:`VOICES`) through SQLAlchemy: SQLite by default (one file,
nothing to install), PostgreSQL (``postgresql+psycopg://...``) for replicas behind an
autoscaler. Every operation is one transaction; a duplicate name is refused by the primary
key (so two replicas racing for a name cannot both win); a database that cannot be reached is
:class:`StoreUnavailable` (503), never a partial write: the client reads only that the store is
unavailable, the log (a ``voice_store_unavailable`` JSON line) where it is and what the driver
said. Calls block: run them in a worker thread (:func:`anyio.to_thread.run_sync`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Column, Float, MetaData, String, Table, Text, create_engine, delete, insert, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError

ENV_VOICE_STORE: Final = "CHATTTS_VOICE_STORE"
"""Environment variable with the store's SQLAlchemy URL."""
NAME_PATTERN: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
"""Saved-voice names: like the voices file's (never a seed or a spk_emb string), at most 64
characters; case-insensitive (stored lower-case)."""
KINDS: Final = ("recording", "spk_smp", "spk_emb", "seed")
"""How a saved voice was given: a recording (stored as its spk_smp), a spk_smp string, a
spk_emb string, or a seed."""
CONNECT_TIMEOUT_S: Final = 5
"""How long a connection attempt to PostgreSQL may take before the store counts as unavailable."""
UNAVAILABLE_MESSAGE: Final = "the voice store is unavailable; try again in a few seconds"
"""What a client is told when the database cannot be reached: not where it is (user, host, port,
database name are the operator's business, in the log)."""

log = logging.getLogger("chattts_serving.gateway.voice_store")

metadata = MetaData()
VOICES: Final = Table(
    "chattts_saved_voices", metadata,
    Column("name", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("speaker", Text, nullable=True),
    Column("spk_smp", Text, nullable=True),
    Column("transcript", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("source_sha256", String(64), nullable=True),
    Column("source_s", Float, nullable=True),
)
"""The one table: ``name`` (lower-case, primary key), ``kind`` (:data:`KINDS`), ``speaker``
(a seed's digits or a spk_emb string; NULL: no speaker vector), ``spk_smp`` and
``transcript`` (the audio prompt), ``created_at`` (Unix seconds), and for a recording its
SHA-256 and duration in seconds."""


class StoreError(Exception):
    """A store operation that failed (message says why)."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or refused the operation: nothing was written. The
    message is the client's (:data:`UNAVAILABLE_MESSAGE`); ``location`` (the URL, password
    masked) and ``detail`` (the driver's error) are the log's."""

    def __init__(self, location: str = "", detail: str = "") -> None:
        super().__init__(UNAVAILABLE_MESSAGE)
        self.location, self.detail = location, detail


class DuplicateVoice(StoreError):
    """A voice of that name exists already."""


@dataclass(frozen=True)
class SavedVoice:
    """One row of :data:`VOICES`."""

    name: str
    kind: str
    speaker: str | None = None
    spk_smp: str | None = None
    transcript: str | None = None
    created_at: float = 0.0
    source_sha256: str | None = None
    source_s: float | None = None

    def request_fields(self) -> dict[str, Any]:
        """What a speech request naming this voice is sent with: ``voice`` (the speaker, or
        ``none`` for no speaker vector when only an audio prompt is stored), and with an
        audio prompt ``spk_smp`` and ``reference_text``."""
        fields: dict[str, Any] = {"voice": self.speaker if self.speaker is not None else "none"}
        if self.spk_smp is not None:
            fields.update(spk_smp=self.spk_smp, reference_text=self.transcript)
        return fields

    def describe(self) -> dict[str, Any]:
        """The public view (``GET /v1/audio/voices``): no prompt strings."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "created_at": int(self.created_at),
                               "has_speaker": self.speaker is not None, "has_audio_prompt": self.spk_smp is not None}
        if self.transcript is not None:
            out["transcript"] = self.transcript
        if self.source_s is not None:
            out["recording_s"] = round(self.source_s, 3)
        return out


def default_store_url() -> str:
    """``$CHATTTS_VOICE_STORE`` if set, else a SQLite file in the user's data directory
    (``$XDG_DATA_HOME`` or ``~/.local/share``, ``chattts-serving/voices.sqlite3``)."""
    env = os.environ.get(ENV_VOICE_STORE, "").strip()
    if env:
        return env
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return f"sqlite:///{base / 'chattts-serving' / 'voices.sqlite3'}"


def redact(url: str) -> str:
    """``url`` without its password (for logs and /health)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def event_line(event: str, level: str, **fields: Any) -> str:
    """One structured log line in the form every part of the project writes
    (``chattts_serving.serving.logs``, which the gateway's layer does not import)."""
    ts = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    return json.dumps({"ts": ts, "level": level, "event": event, **fields}, ensure_ascii=True,
                      separators=(",", ":"), default=str)


class VoiceStore:
    """The saved voices in the database at ``url`` (a SQLAlchemy URL: ``sqlite:///path``,
    ``postgresql+psycopg://user:password@host:5432/db``).

    Nothing is connected at construction: the table is created (if missing) by the first
    operation, so a gateway starts while its database is still starting. Thread-safe.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if url.startswith("sqlite"):
            path = url.split("///", 1)[1] if "///" in url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": CONNECT_TIMEOUT_S}
        elif url.startswith("postgresql"):
            kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
            kwargs["pool_recycle"] = 300
        self.engine: Engine = create_engine(url, **kwargs)
        self._ready = False
        self._lock = threading.Lock()

    def _prepare(self, operation: str) -> None:
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            try:
                metadata.create_all(self.engine, checkfirst=True)
            except IntegrityError:  # another replica created it at the same moment
                pass
            except OperationalError as exc:
                raise self._unavailable(exc, operation) from None
            except DBAPIError as exc:
                if "already exists" not in str(exc):
                    raise self._unavailable(exc, operation) from None
            self._ready = True

    def _unavailable(self, exc: BaseException, operation: str) -> StoreUnavailable:
        """The error for a client, after the log line for the operator: ``voice_store_unavailable``
        with the store's location (password masked), the operation and the driver's first line."""
        lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        detail = lines[0] if lines else type(exc).__name__
        password = make_url(self.url).password
        if password:
            detail = detail.replace(str(password), "***")
        error = StoreUnavailable(redact(self.url), detail)
        log.error(event_line("voice_store_unavailable", "error", store=error.location, operation=operation,
                             error=detail))
        return error

    def _run(self, operation: str, work: Any) -> Any:
        self._prepare(operation)
        try:
            with self.engine.begin() as conn:
                return work(conn)
        except IntegrityError:
            raise
        except SQLAlchemyError as exc:
            raise self._unavailable(exc, operation) from None

    def add(self, voice: SavedVoice) -> SavedVoice:
        """Insert ``voice`` (its name lower-cased). Raises DuplicateVoice, StoreUnavailable."""
        row = {**voice.__dict__, "name": voice.name.lower(), "created_at": voice.created_at or time.time()}
        try:
            self._run("add", lambda conn: conn.execute(insert(VOICES).values(**row)))
        except IntegrityError:
            raise DuplicateVoice(f"a voice named {voice.name!r} exists already") from None
        return SavedVoice(**row)

    def get(self, name: str) -> SavedVoice | None:
        """The voice named ``name`` (case-insensitive), or None. Raises StoreUnavailable."""
        row = self._run("get", lambda conn: conn.execute(select(VOICES).where(VOICES.c.name == name.strip().lower()))
                        .mappings().first())
        return SavedVoice(**row) if row is not None else None

    def list(self) -> list[SavedVoice]:
        """Every saved voice, by name. Raises StoreUnavailable."""
        rows = self._run("list", lambda conn: conn.execute(select(VOICES).order_by(VOICES.c.name)).mappings().all())
        return [SavedVoice(**r) for r in rows]

    def delete(self, name: str) -> bool:
        """Remove the voice named ``name``; whether it existed. Raises StoreUnavailable."""
        result = self._run("delete",
                           lambda conn: conn.execute(delete(VOICES).where(VOICES.c.name == name.strip().lower())))
        return bool(result.rowcount)

    def close(self) -> None:
        """Close the connection pool."""
        self.engine.dispose()
