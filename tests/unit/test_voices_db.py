"""``make voices-db`` (scripts/voices_db.sh): a local PostgreSQL for the saved voices, as a
person runs it: the cluster is made on first use (as root it belongs to the ``postgres`` user,
since PostgreSQL refuses root), a second start finds it running, the printed
``CHATTTS_VOICE_STORE`` URL is one the gateway's voice store reads and writes, and ``stop``
stops it. Skipped without Debian's postgresql binaries (``make setup`` installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from chattts_serving.gateway.voice_store import SavedVoice, VoiceStore
from tests.support.servers import ROOT, free_port

SCRIPT = ROOT / "scripts" / "voices_db.sh"


def _run(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_voices_db_starts_once_prints_a_url_the_store_uses_and_stops() -> None:
    if shutil.which("initdb") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("PostgreSQL is not installed (Debian package postgresql: scripts/debian_packages.sh)")
    root = Path(tempfile.mkdtemp(prefix="chattts-voices-db-"))
    os.chmod(root, 0o755)  # as root, the cluster's owner (postgres) must reach it
    env = {**os.environ, "VOICES_DB_DIR": str(root / "db"), "VOICES_DB_PORT": str(free_port())}
    try:
        out = _run(env)
        url = out.strip().splitlines()[-1].removeprefix("export CHATTTS_VOICE_STORE=")
        assert url == f"postgresql+psycopg://postgres@127.0.0.1:{env['VOICES_DB_PORT']}/postgres", out
        assert _run(env).strip().splitlines()[-1] == out.strip().splitlines()[-1]  # running: started once
        store = VoiceStore(url)
        try:
            store.add(SavedVoice(name="reader", kind="seed", speaker="7", created_at=1.0))
            assert [v.name for v in store.list()] == ["reader"] and store.delete("reader")
        finally:
            store.close()
        _run(env, "stop")
        assert not (root / "db" / "data" / "postmaster.pid").exists()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
