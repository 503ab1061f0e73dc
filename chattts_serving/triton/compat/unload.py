"""Register rows "cycles at exit", "threads at stub exit" and "metrics at unload"
(docs/triton-workarounds.md): the finalize discipline, what a model frees and in which order
while the stub's shared memory still exists.

- symptom: a stub dies at its exit (``Fatal Python error: Segmentation fault ...
  Garbage-collecting``, ``Metric::Clear`` from ``~MetricFamily``) and its model never unloads;
  or a thread of the model wakes while the stub exits and crashes it.
- cause: what is still alive when the stub's interpreter exits (objects in reference cycles,
  metric families, running threads) is freed or run after the stub's shared memory is gone;
  and the backend's metric calls are not thread-safe.
- what we do: :func:`freeze_start_heap` moves what ``start`` built out of the cyclic GC's
  sight (the collections at unload then walk only what serving made: over the front end's heap
  they outlasted the exit timeout on busy cores); at unload the hooks (:mod:`.hooks`) first end
  what sends responses (deferred finals, an entry model's runtime: every request ended, every
  thread joined, :meth:`~chattts_serving.serving.entry_runtime.EntryRuntime.stop`), then
  :func:`release` deletes the metric families (every update takes the model's metrics lock,
  :mod:`chattts_serving.triton.metrics`), and :func:`collect_cycles` ends every ``finalize``.
  Models hold no cycle (the pinger, the server stopper and the runtime's handler hold no model);
  ``text/frontend.py`` compiles the normaliser at start.
- shown by: ``tests/unit/test_triton_layer.py::test_finalized_models_are_freed_by_reference_counting_alone``,
  ``tests/unit/test_entry_runtime.py`` (no thread left), ``tests/server/test_faults.py`` (a
  stop with live streams), the crash-sign scan of every test server's log (``tests/conftest.py``).
- delete when: the stub frees Triton objects and metric families safely after its shared
  memory is gone, joins or outlives model threads, and metric calls are thread-safe.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


def freeze_start_heap(pb: Any) -> None:
    """Move what ``start`` built, which lives as long as the stub, out of the cyclic GC's sight.
    Only in a stub (the real ``pb``): elsewhere the process is not this model's."""
    if getattr(pb, "__name__", None) != "triton_python_backend_utils":
        return
    gc.collect()
    gc.freeze()


def release(owned: Iterable[Closable]) -> None:
    """Close what a model registered to be freed at unload (its metric families), in order."""
    for thing in owned:
        thing.close()


def collect_cycles() -> None:
    """The last step of every ``finalize``: collect the cyclic garbage while the stub's shared
    memory still exists."""
    gc.collect()
