"""Stand-ins for the BLS side of ``triton_python_backend_utils`` an engine stream uses:
a decoupled call's response iterator, its responses and tensors."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from chattts_serving import contract


class FakeTensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self.name, self.value = name, value

    def as_numpy(self) -> np.ndarray:
        return self.value


class FakeResponse:
    def __init__(self, tensors: dict[str, np.ndarray] | None) -> None:
        self.tensors = tensors or {}

    def has_error(self) -> bool:
        return False


class FakeIterator:
    """A decoupled BLS call's responses: batches of 2 tokens, the last with stop reason eos,
    then the empty final response."""

    def __init__(self, batches: int, hidden: int) -> None:
        def batch(i: int) -> FakeResponse:
            stop = "eos" if i == batches - 1 else ""
            return FakeResponse({contract.EN_CODES.name: np.zeros((2, contract.NUM_VQ), np.int32),
                              contract.EN_HIDDEN.name: np.zeros((2, hidden), np.float32),
                              contract.EN_STOP.name: np.array([stop.encode()], np.object_)})
        self._items = iter([batch(i) for i in range(batches)] + [FakeResponse(None)])

    def __iter__(self) -> FakeIterator:
        return self

    def __next__(self) -> FakeResponse:
        return next(self._items)


class FakeBlsPb:
    """The parts of ``triton_python_backend_utils`` an engine stream uses."""

    def __init__(self) -> None:
        self.iterators: list[weakref.ref[FakeIterator]] = []

    Tensor = FakeTensor

    def InferenceRequest(self, **_: Any) -> Any:  # Triton's name
        pb = self

        class _Request:
            def exec(self, decoupled: bool = False) -> FakeIterator:
                assert decoupled
                it = FakeIterator(3, 8)
                pb.iterators.append(weakref.ref(it))
                return it
        return _Request()

    @staticmethod
    def get_output_tensor_by_name(resp: FakeResponse, name: str) -> FakeTensor | None:
        return FakeTensor(name, resp.tensors[name]) if name in resp.tensors else None
