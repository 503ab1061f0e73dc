"""Tensors and errors between Triton's Python backend (``pb``: the
``triton_python_backend_utils`` module, which exists only inside a stub process and is
therefore passed in) and numpy / :class:`~chattts_serving.errors.RequestError`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import contract
from ..errors import ErrorKind, RequestError, StageDown, decode_tagged, from_message, untagged_kind


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


def triton_error(pb: Any, exc: RequestError) -> Any:
    """The ``pb_utils.TritonError`` for ``exc``: the code of its kind
    (:data:`chattts_serving.errors.STATUS`), the message tagged with the kind
    (:func:`chattts_serving.errors.encode`) so that BLS callers and gRPC stream clients, which
    never see the code, recover it."""
    code = getattr(pb.TritonError, exc.status.triton, None)
    return pb.TritonError(exc.wire(), code) if code is not None else pb.TritonError(exc.wire())


TRITON_SHUTTING_DOWN = "Server not ready"
"""What Triton 2.51 answers a BLS call with once the server is stopping (docs/triton-workarounds.md,
"server not ready")."""


def error_from_triton(error: Any) -> RequestError:
    """The :class:`RequestError` behind a ``TritonError`` received from a BLS call: the kind
    its message carries; UNAVAILABLE for Triton's own unavailability (the server is stopping,
    a model is being loaded, a model's process died: :data:`chattts_serving.errors.TRITON_UNAVAILABLE`;
    the client should retry, here after the restart or on another server; a stage that is down is a
    :class:`~chattts_serving.errors.StageDown`); else INTERNAL."""
    message = str(error.message())
    if decode_tagged(message).kind is None and untagged_kind(message, None) == ErrorKind.UNAVAILABLE:
        if TRITON_SHUTTING_DOWN in message:
            return RequestError(f"server unavailable: the server is shutting down ({message})", ErrorKind.UNAVAILABLE)
        return StageDown(f"server unavailable: a model process is unavailable ({message})")
    return from_message(message)
