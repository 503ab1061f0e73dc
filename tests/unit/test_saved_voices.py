"""The saved voices' store (chattts_serving/gateway/voice_store.py) without a server: SQLite, the
default, needs no setup and keeps voices across restarts; where the default file lives; a
database that cannot be reached is StoreUnavailable, its password never in the message. The
gateway's ``/v1/audio/voices`` on real servers: tests/server/test_saved_voices.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.voice_store import (
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
