"""Delivery receipts from the engine to the entry models (chattts_serving/triton/compat/receipts.py)
on a real tritonserver: every entry stub listens for the receipts of its streams and the
engine writes them. The socket pair and the engine stream in process:
tests/unit/test_receipts.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from chattts_serving import contract
from chattts_serving.triton.compat.receipts import delivery_address
from tests.support.servers import Server, stub_processes


def test_the_entry_stub_listens_for_receipts_and_the_engine_writes_them(triton_server: Server) -> None:
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    text = np.array(["你好。".encode()], dtype=np.object_)
    inputs = [grpcclient.InferInput(contract.IN_TEXT.name, [1], "BYTES"),
              grpcclient.InferInput("max_new_tokens", [1], "INT32")]
    inputs[0].set_data_from_numpy(text)
    inputs[1].set_data_from_numpy(np.array([8], np.int32))
    result = client.infer(contract.MODEL_OFFLINE, inputs, request_id=uuid.uuid4().hex)
    assert result.as_numpy(contract.OUT_AUDIO.name).size > 0
    import psutil

    server_pid = triton_server.server.proc.pid  # type: ignore[union-attr]
    unix = [line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:]]

    def named(pid: int) -> int:
        return unix.count("@" + delivery_address(stub_pid=pid, server_pid=server_pid)[1:])

    offline = [p.pid for p in psutil.Process(server_pid).children(recursive=True)
               if f"/{contract.MODEL_OFFLINE_ENTRY}/1/model.py" in " ".join(p.cmdline())]
    # each instance listens; the one that ran the request also holds the engine's connection
    # (both ends of an accepted connection are named after the listener)
    assert offline and all(named(pid) >= 1 for pid in offline), offline
    assert any(named(pid) >= 2 for pid in offline), "no engine connected to an offline instance's receipts"
    assert named(stub_processes(triton_server)[contract.MODEL_STREAM_ENTRY].pid) >= 1
    log = triton_server.log_path.read_text(errors="replace")
    assert "reads without receipts" not in log and "receipts could not be written" not in log


