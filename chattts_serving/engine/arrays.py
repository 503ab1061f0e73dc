"""Where the engine's KV cache lives: an array backend over numpy (host) or cupy (CUDA device).

The engine writes its KV buffers and attention mask with plain array indexing (``buf[:, :, w]
= new[:, :, 0]``, slices, ``zeros``), which numpy and cupy spell the same way; this module
gives it the array module (``xp``), allocation, host <-> device transfers and the raw buffer
pointers that ONNX Runtime's IO binding takes (``bind_input(name, device_type, device_id,
element_type, shape, buffer_ptr)``).

cupy (``cupy-cuda12x``, the ``gpu`` extra) is imported only by :func:`cupy_backend`, i.e. only
when a profile asks for IO binding on the CUDA execution provider; CPU hosts never need it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArrayBackend:
    """An array library bound to one device.

    ``xp``: the array module (numpy or cupy). ``device_type``: ONNX Runtime's name of the
    memory the arrays live in, ``"cpu"`` or ``"cuda"``. ``device_id``: the GPU ordinal (0 on
    CPU).
    """

    xp: ModuleType
    device_type: str
    device_id: int = 0

    @property
    def on_device(self) -> bool:
        """True when arrays live in accelerator memory (transfers needed to read them)."""
        return self.device_type != "cpu"

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zero-filled C-contiguous array of ``shape`` and ``dtype`` on this backend's device."""
        return self.xp.zeros(shape, dtype)

    def to_device(self, a: np.ndarray) -> Any:
        """A C-contiguous copy of host array ``a`` on this device (``a`` itself, made
        contiguous, on the host backend)."""
        if not self.on_device:
            return np.ascontiguousarray(a)
        return self.xp.ascontiguousarray(self.xp.asarray(a))

    def to_host(self, a: Any) -> np.ndarray:
        """Host (numpy) array of ``a`` (a device -> host copy on a device backend)."""
        if not self.on_device:
            return np.asarray(a)
        return self.xp.asnumpy(a)  # type: ignore[no-any-return]

    def ptr(self, a: Any) -> int:
        """Address of ``a``'s first element. ``a`` must be C-contiguous (ValueError otherwise):
        ONNX Runtime reads a bound buffer as dense row-major memory of the bound shape."""
        if not a.flags.c_contiguous:
            raise ValueError(f"an IO-bound buffer must be C-contiguous (shape {a.shape})")
        if not self.on_device:
            return int(a.ctypes.data)
        return int(a.data.ptr)

    def synchronize(self) -> None:
        """Wait until work queued on the device is done (no-op on the host)."""
        if self.on_device:
            self.xp.cuda.Device(self.device_id).synchronize()


NUMPY = ArrayBackend(np, "cpu", 0)
"""Host memory through numpy: the CPU execution provider's backend (with or without IO binding)."""


def cupy_backend(device_id: int = 0) -> ArrayBackend:
    """cupy arrays on CUDA device ``device_id``.

    Raises:
        ImportError: cupy is not installed (``pip install cupy-cuda12x``, in the ``gpu`` extra).
        RuntimeError: cupy is installed but cannot reach the device (no driver/GPU).
    """
    import cupy  # optional dependency (the gpu extra), GPU hosts only

    try:
        cupy.cuda.Device(device_id).use()
    except Exception as exc:
        raise RuntimeError(f"cupy cannot use CUDA device {device_id}: {exc}") from exc
    return ArrayBackend(cupy, "cuda", device_id)


def backend_for_session(providers: list[str], io_binding: bool, device_id: int = 0) -> ArrayBackend:
    """The backend for a session whose active providers are ``providers`` (``session.get_providers()``).

    With IO binding on the CUDA execution provider: cupy on ``device_id``; when cupy is missing
    or unusable, numpy with a logged warning (IO binding then still runs, ONNX Runtime copies
    the host-resident KV cache to the device each step: correct, but slower). Otherwise numpy.
    """
    if io_binding and providers and providers[0] in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        try:
            return cupy_backend(device_id)
        except (ImportError, RuntimeError) as exc:
            log.warning("IO binding on %s wants cupy for a device-resident KV cache (%s); "
                        "falling back to host buffers", providers[0], exc)
    return NUMPY
