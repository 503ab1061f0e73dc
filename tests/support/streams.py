"""One gRPC stream on ``chattts`` in a background thread, recording its times."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from chattts_serving import contract


class Stream:
    """One gRPC stream on ``chattts`` in a background thread, recording times (s since start)."""

    def __init__(self, url: str, text: str, seed: int, tokens: int, parameters: dict | None = None,
                 priority: str | None = None, timeout_s: float | None = None,
                 extra: tuple[tuple[str, np.ndarray, str], ...] = (), request_id: str = "") -> None:
        self.url, self.chunks, self.error = url, [], None  # type: ignore[var-annotated]
        self.request_id = request_id
        self.extra = extra  # more inputs: (name, value, Triton dtype)
        self.text, self.seed, self.tokens = text, seed, tokens
        self.parameters, self.priority, self.timeout_s = parameters, priority, timeout_s
        self.first_audio_s: float | None = None
        self.end_s: float | None = None
        self.first_chunk = threading.Event()
        self.done = threading.Event()
        self.client = grpcclient.InferenceServerClient(url)
        self.q: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.t0 = 0.0

    def inputs(self) -> list[grpcclient.InferInput]:
        out = []
        for name, value, dt in (("text", np.array([self.text.encode()], np.object_), "BYTES"),
                                ("seed", np.array([self.seed], np.int64), "INT64"),
                                ("max_new_tokens", np.array([self.tokens], np.int32), "INT32"),
                                ("min_new_tokens", np.array([self.tokens], np.int32), "INT32"),
                                *([("priority", np.array([self.priority.encode()], np.object_), "BYTES")]
                                  if self.priority else []),
                                *([("timeout_s", np.array([self.timeout_s], np.float32), "FP32")]
                                  if self.timeout_s else []), *self.extra):
            i = grpcclient.InferInput(name, list(value.shape), dt)
            i.set_data_from_numpy(value)
            out.append(i)
        return out

    def start(self) -> Stream:
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))
        self.t0 = time.perf_counter()
        self.client.async_stream_infer(contract.MODEL_STREAM, self.inputs(), enable_empty_final_response=True,
                                       parameters=self.parameters, request_id=self.request_id)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        while True:
            try:
                result, error = self.q.get(timeout=120)
            except queue.Empty:
                self.error = "timeout"
                break
            now = time.perf_counter() - self.t0
            if error is not None:
                self.error, self.end_s = str(error), now
                break
            audio = result.as_numpy(contract.OUT_AUDIO.name)
            if audio is not None and audio.size:
                self.chunks.append(audio)
                if self.first_audio_s is None:
                    self.first_audio_s = now
                    self.first_chunk.set()
            if result.get_response().parameters["triton_final_response"].bool_param:
                self.end_s = now
                break
        self.first_chunk.set()  # wake waiters on error or end too; they check .error / .chunks
        self.done.set()

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)

    def close(self) -> None:
        if not self.done.is_set():
            self.cancel()
        self.done.wait(30)
        self.client.stop_stream()
        self.client.close()

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
