"""The admin token without a server: where it comes from, the flags it becomes, how a generated
one is published, what ``chattts-tritonserver`` refuses before it starts Triton, and that the
real-server tests (tests/server/test_admin.py) call every restricted API group."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_serving.deploy import admin
from tests.support.admin_calls import ADMIN_GRPC, ADMIN_HTTP


def test_the_tests_cover_every_restricted_group() -> None:
    assert {g for g, *_ in ADMIN_HTTP} == set(admin.RESTRICTED_APIS)
    assert set(ADMIN_GRPC) == set(admin.RESTRICTED_APIS)


def test_chattts_tritonserver_refuses_bad_tokens_and_its_own_flags(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "chattts_serving.deploy.container", "--model-repository=/nonexistent"]
    env = {k: v for k, v in os.environ.items() if k != admin.TOKEN_FILE_ENV}
    for extra, token, message in (([], "short", "at least 16 characters"),
                                  ([], "has a space in it, sixteen+", "printable ASCII without spaces"),
                                  (["--http-restricted-api=logging:a=b"], "k" * 20, "do not pass it")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=60,
                              env={**env, admin.TOKEN_ENV: token, admin.TRITONSERVER_ENV: "/bin/false"})
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_token_sources_in_order_and_the_flags_triton_expects(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-a-secret-file-0123\n")
    nowhere = {admin.TOKEN_FILE_ENV: str(tmp_path / "missing")}
    assert admin.token_from_env(nowhere) is None
    assert admin.token_from_env({admin.TOKEN_FILE_ENV: str(secret)}) == "from-a-secret-file-0123"
    both = {admin.TOKEN_ENV: "from-the-environment-0", admin.TOKEN_FILE_ENV: str(secret)}
    assert admin.token_from_env(both) == "from-the-environment-0"
    assert admin.token_from_env({admin.TOKEN_ENV: "", admin.TOKEN_FILE_ENV: str(secret)}) == "from-a-secret-file-0123"
    assert admin.token_file({}) == Path("~/.config/chattts/admin-token").expanduser()
    assert admin.new_token() != admin.new_token() and len(admin.new_token()) >= 32
    with pytest.raises(admin.AdminTokenError, match="at least 16"):
        admin.token_from_env({admin.TOKEN_ENV: "tiny"})
    spec = f"logging,trace,shared-memory,model-repository,statistics:{admin.ADMIN_HEADER}=from-the-environment-0"
    assert admin.restriction_args("from-the-environment-0") == [f"--http-restricted-api={spec}",
                                                                f"--grpc-restricted-protocol={spec}"]
    assert admin.grpc_headers(None) == admin.http_headers(None) == {}


def test_a_published_token_is_private_to_its_user_and_read_back(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    env = {admin.TOKEN_FILE_ENV: str(tmp_path / "deep" / "dir" / "token")}
    token = admin.new_token()
    admin.publish("prog", token, env)
    assert stat.S_IMODE(os.stat(env[admin.TOKEN_FILE_ENV]).st_mode) == 0o600
    assert admin.token_from_env(env) == token
    err = capsys.readouterr().err
    assert err.count(token) == 1 and admin.GRPC_ADMIN_HEADER in err
    (tmp_path / "a-file").write_text("")  # a parent that is a file: unwritable, even for root
    admin.publish("prog", token, {admin.TOKEN_FILE_ENV: str(tmp_path / "a-file" / "token")})
    err = capsys.readouterr().err
    assert err.count(token) == 1 and "not kept: cannot write" in err, err


def test_the_inference_key_sources_flags_and_refusal_in_plain_words(tmp_path: Path) -> None:
    from chattts_serving.client import keys

    assert keys.inference_key_from_env({}) is None, "no key unless one is configured"
    secret = tmp_path / "key"
    secret.write_text("inference-key-from-a-file\n")
    assert keys.inference_key_from_env({keys.INFERENCE_KEY_FILE_ENV: str(secret)}) == "inference-key-from-a-file"
    assert keys.inference_key_from_env({keys.INFERENCE_KEY_ENV: "inference-key-from-env",
                                        keys.INFERENCE_KEY_FILE_ENV: str(secret)}) == "inference-key-from-env"
    secret.write_text("\n")
    with pytest.raises(keys.InferenceKeyError, match="empty"):
        keys.inference_key_from_env({keys.INFERENCE_KEY_FILE_ENV: str(secret)})
    with pytest.raises(keys.InferenceKeyError, match="at least 16"):
        keys.inference_key_from_env({keys.INFERENCE_KEY_ENV: "short"})
    spec = "inference:chattts-inference-key=inference-key-from-env"
    assert admin.inference_restriction_args("inference-key-from-env") == [f"--http-restricted-api={spec}",
                                                                        f"--grpc-restricted-protocol={spec}"]
    assert admin.inference_restriction_args(None) == []
    assert keys.grpc_metadata("k") == {"triton-grpc-protocol-chattts-inference-key": "k"}
    refusal = "This protocol is restricted, expecting header 'triton-grpc-protocol-chattts-inference-key'"
    err = keys.key_error(refusal, "h:1", sent=False, grpc=True)
    assert err is not None and err.message.startswith("inference key required") and not err.connection
    assert keys.key_error("Request for unknown model", "h:1", sent=False, grpc=True) is None


def test_the_server_command_binds_its_address_loads_explicitly_and_adds_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chattts_serving.deploy.server import TritonServer

    (tmp_path / "repo").mkdir()
    monkeypatch.delenv("CHATTTS_INFERENCE_KEY", raising=False)
    monkeypatch.delenv("CHATTTS_INFERENCE_KEY_FILE", raising=False)
    plain = TritonServer(tmp_path / "repo", build_dir=tmp_path / "build", admin_token="a" * 20).command()
    keyed = TritonServer(tmp_path / "repo", build_dir=tmp_path / "build", admin_token="a" * 20,
                         address="0.0.0.0", inference_key="k" * 20).command()
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--model-control-mode=explicit", "--load-model=*"):
        assert flag in plain, flag
    assert not any("inference:" in a for a in plain), "inference is open without a key"
    assert "--grpc-address=0.0.0.0" in keyed
    assert f"--grpc-restricted-protocol=inference:chattts-inference-key={'k' * 20}" in keyed
