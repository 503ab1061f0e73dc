"""Quiet logs without a server: the launcher's re-levelling of the CUDA errors a CPU host always
gets (:mod:`chattts_serving.deploy.loglevels`), and a model's ping to itself read to its end at
once (the stop-time deadlock of python_backend r24.10; chattts_serving/triton/compat/pings.py).
The served whole: tests/server/test_quiet_logs.py."""

from __future__ import annotations

import io
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.deploy.loglevels import copy, relevel
from chattts_serving.triton import models
from chattts_serving.triton.compat import pings
from tests.support.fake_triton import FakePb

CUDA_HELPER = b'E1206 04:06:50.151980 6155 server.cc:241] "CudaDriverHelper has not been initialized."\n'
ENSEMBLE_STREAM = (b'E1206 04:06:59.038645 6155 ensemble_scheduler.cc:1468] "unable to create stream for '
                   b'chattts_ensemble: CUDA driver version is insufficient for CUDA runtime version"\n')


def test_the_two_cpu_host_errors_become_info_lines_and_nothing_else_changes() -> None:
    assert relevel(CUDA_HELPER) == b"I" + CUDA_HELPER[1:]
    assert relevel(ENSEMBLE_STREAM) == b"I" + ENSEMBLE_STREAM[1:]
    assert relevel(CUDA_HELPER.rstrip(b"\n")) == b"I" + CUDA_HELPER[1:-1]  # a last line without newline
    for line in (
        b'E1206 04:07:10.810324 6155 main.cc:535] "failed to stop server: Internal - Exit timeout expired."\n',
        CUDA_HELPER.replace(b"server.cc", b"model_lifecycle.cc"),   # the same words from elsewhere
        ENSEMBLE_STREAM.replace(b"insufficient", b"too old"),       # another CUDA error
        CUDA_HELPER.replace(b'."\n', b'." and more\n'),
        b'{"ts":"x","level":"error","event":"request_finished"}\n',
        b"W" + CUDA_HELPER[1:],
        b"I" + CUDA_HELPER[1:],
        b"",
    ):
        assert relevel(line) == line


def test_the_filter_copies_every_line_in_order() -> None:
    other = b"I1206 04:06:50.2 6155 server.cc:1] \"x\"\n"
    out = io.BytesIO()
    copy(io.BytesIO(CUDA_HELPER + other + ENSEMBLE_STREAM + b"tail"), out)
    assert out.getvalue() == b"I" + CUDA_HELPER[1:] + other + b"I" + ENSEMBLE_STREAM[1:] + b"tail"


class _PingAnswer:
    """A decoupled BLS response iterator as ``exec`` returns it for a ping: the answer (the final
    flag alone) already buffered."""

    def __init__(self) -> None:
        self.left = [object()]
        self.ended = False

    def __iter__(self) -> _PingAnswer:
        return self

    def __next__(self) -> Any:
        if self.left:
            return self.left.pop()
        self.ended = True
        raise StopIteration


@pytest.mark.parametrize("cls", [models.StreamingEntryModel, models.EngineModel])
def test_a_ping_is_read_to_its_end_before_its_iterator_goes_to_the_grave(
        cls: type[models.TritonModel], monkeypatch: pytest.MonkeyPatch) -> None:
    """An iterator left unread stays in the stub's own map until the stub unloads, where
    freeing several deadlocked the stub and held the server to its exit timeout."""
    pb = FakePb()
    answers: list[_PingAnswer] = []

    class Request:
        def __init__(self, **kwargs: Any) -> None:
            assert kwargs["parameters"] == {contract.PING_PARAMETER: True}

        def exec(self, decoupled: bool = False) -> _PingAnswer:
            assert decoupled
            answers.append(_PingAnswer())
            return answers[-1]

    pb.InferenceRequest = Request  # type: ignore[assignment]
    kept: list[tuple[_PingAnswer, bool]] = []
    monkeypatch.setattr(pings, "keep_iterator", lambda it: kept.append((it, it.ended)))
    pinger = pings.Pinger(pb, "pinging", cls.sends_from_threads, cls.decoupled)
    pinger.ping()
    pinger.ping()
    assert kept == [(answers[0], True), (answers[1], True)]
