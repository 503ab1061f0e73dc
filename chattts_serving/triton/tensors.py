"""Tensors between Triton's Python backend (``pb``: the ``triton_python_backend_utils``
module, which exists only inside a stub process and is therefore passed in) and numpy. Errors
cross with :mod:`~chattts_serving.triton.compat.error_codes`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import contract


def request_inputs(pb: Any, request: Any, specs: Sequence[contract.TensorSpec]) -> dict[str, np.ndarray]:
    """The request's tensors among ``specs`` as numpy arrays (absent optional ones omitted)."""
    out = {}
    for spec in specs:
        t = pb.get_input_tensor_by_name(request, spec.name)
        if t is not None:
            out[spec.name] = t.as_numpy()
    return out


def string_tensor(pb: Any, name: str, value: str) -> Any:
    """A BYTES tensor of shape [1] holding ``value`` as UTF-8."""
    return pb.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def first_string(arr: np.ndarray) -> str:
    """The first element of a BYTES tensor (from a model of ours: UTF-8) as str."""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def entry_request(pb: Any, request: Any, specs: Sequence[contract.TensorSpec] = contract.ENTRY_INPUTS
                  ) -> tuple[dict[str, np.ndarray], dict[str, object], str]:
    """An entry request's tensors (``specs``), Triton request parameters (an unparsable JSON
    reads as none) and request id (the client's, or a generated UUID hex)."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (ValueError, TypeError):
        params = {}
    return request_inputs(pb, request, specs), params, request.request_id() or uuid.uuid4().hex
