"""The saved voices' store (chattts_serving/gateway/voice_store.py) without a server: SQLite, the
default, needs no setup and keeps voices across restarts; where the default file lives; a
database that cannot be reached is StoreUnavailable, its location only in the log. The
gateway's ``/v1/audio/voices`` on real servers: tests/server/test_saved_voices.py."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.saved_voices import unavailable
from chattts_serving.gateway.voice_store import (
    UNAVAILABLE_MESSAGE,
    DuplicateVoice,
    SavedVoice,
    StoreUnavailable,
    VoiceStore,
    default_store_url,
    redact,
)


def test_the_sqlite_default_needs_no_setup_and_keeps_voices_across_restarts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new-dir' / 'voices.sqlite3'}"
    store = VoiceStore(url)
    assert store.list() == []
    store.add(SavedVoice("Narrator2", "seed", speaker="42"))
    with pytest.raises(DuplicateVoice):
        store.add(SavedVoice("narrator2", "seed", speaker="43"))
    store.close()
    again = VoiceStore(url)
    got = again.get("NARRATOR2")
    assert got is not None and got.name == "narrator2" and got.speaker == "42" and got.created_at > 0
    assert [v.name for v in again.list()] == ["narrator2"]
    assert again.delete("narrator2") and not again.delete("narrator2") and again.get("narrator2") is None


def test_the_default_store_is_a_sqlite_file_in_the_users_data_directory(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATTTS_VOICE_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = default_store_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'chattts-serving' / 'voices.sqlite3'}"
    assert GatewaySettings().voice_store == url
    VoiceStore(url).add(SavedVoice("first", "seed", speaker="1"))  # the directory is made on first use
    assert (tmp_path / "data" / "chattts-serving" / "voices.sqlite3").is_file()
    monkeypatch.setenv("CHATTTS_VOICE_STORE", "postgresql+psycopg://u:p@db/voices")
    assert GatewaySettings.from_env().voice_store == "postgresql+psycopg://u:p@db/voices"
    assert redact(default_store_url()) == "postgresql+psycopg://u:***@db/voices"


def test_an_unreachable_database_is_store_unavailable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    store = VoiceStore(f"sqlite:///{tmp_path / 'a-directory'}")  # a directory is no database file
    with pytest.raises(StoreUnavailable, match="unavailable"):
        store.list()
    pg = VoiceStore("postgresql+psycopg://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(StoreUnavailable) as info:
        pg.get("x")
    assert "secret" not in str(info.value)  # the password is never in a message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unavailable_store_tells_the_client_only_that_and_the_log_where_and_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """The database's user, host, port and name are the operator's business: the client reads
    that the store is unavailable and to retry; the log line (JSON) has the location, password
    masked, the operation and the driver's error."""
    port = _closed_port()
    store = VoiceStore(f"postgresql+psycopg://keeper:s3cret@127.0.0.1:{port}/voicedb")
    with caplog.at_level(logging.ERROR, logger="chattts_serving.gateway.voice_store"), \
            pytest.raises(StoreUnavailable) as info:
        store.get("narrator")
    assert str(info.value) == UNAVAILABLE_MESSAGE == "the voice store is unavailable; try again in a few seconds"
    (record,) = [r for r in caplog.records if r.name == "chattts_serving.gateway.voice_store"]
    line = json.loads(record.getMessage())
    assert line["level"] == "error" and line["event"] == "voice_store_unavailable" and line["operation"] == "get"
    assert line["store"] == f"postgresql+psycopg://keeper:***@127.0.0.1:{port}/voicedb"
    assert str(port) in line["error"] and "s3cret" not in record.getMessage()
    error = unavailable(info.value)
    assert error.status == 503 and error.code == "voice_store_unavailable"
    assert error.message == UNAVAILABLE_MESSAGE


def test_the_gateways_503_names_no_database(caplog: pytest.LogCaptureFixture) -> None:
    """``GET /v1/audio/voices`` with the store on a closed port: 503 whose body holds none of
    the database's user, host, port or name; the gateway's log holds them."""
    from fastapi.testclient import TestClient

    from chattts_serving.gateway import create_app

    port = _closed_port()
    url = f"postgresql+psycopg://keeper:s3cret@127.0.0.1:{port}/voicedb"
    app = create_app(GatewaySettings(triton_url=f"127.0.0.1:{_closed_port()}", voice_store=url))
    with caplog.at_level(logging.ERROR, logger="chattts_serving.gateway.voice_store"), TestClient(app) as client:
        r = client.get("/v1/audio/voices")
    assert r.status_code == 503, r.text
    assert r.json()["error"] == {"message": UNAVAILABLE_MESSAGE, "type": r.json()["error"]["type"], "param": None,
                                 "code": "voice_store_unavailable"}
    assert not any(secret in r.text for secret in ("keeper", "s3cret", "127.0.0.1", str(port), "voicedb", "postgres"))
    assert any(f"keeper:***@127.0.0.1:{port}/voicedb" in rec.getMessage() for rec in caplog.records)
