"""The hooks through which the models reach the Triton 2.51 workarounds of this package.

A model owns one hooks object (``self.hooks``), made in ``initialize``, and calls it at fixed
points of its life: :meth:`ModelHooks.started` after ``start``, :meth:`ModelHooks.executing`
around ``execute``'s body, :meth:`ModelHooks.answered` for each request (pings end there),
:meth:`ModelHooks.sender` for each request's response sender, :meth:`ModelHooks.close` first
at unload, :meth:`ModelHooks.finalize` last. The kinds: :class:`ModelHooks` (every model),
:class:`EngineHooks` (the GPT engine), :class:`EntryHooks` (the entry models) and
:class:`EnsembleStepHooks` (the ensemble's last step). A workaround that Triton makes
unnecessary is deleted as its module and its lines here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from ... import contract
from ...serving.entry_runtime import EntryRuntime, SharedHelper
from ...serving.threads import Spawn, start_thread
from .cancels import CancelListener, cancel_address
from .ensemble import engine_cancel_address, relay_cancel
from .finals import DeferredFinals, DeferredFinalSender
from .grave import ITERATOR_GRAVE
from .pings import Pinger
from .receipts import RECEIPT_BOARD, ReceiptWriter, receipted
from .unload import Closable, collect_cycles, freeze_start_heap, release

log = logging.getLogger(__name__)


class ModelHooks:
    """Every model's: ``specs`` (the model's inputs) for a model that sends final responses from
    its own threads, which then leave only inside ``execute`` (:mod:`.finals`, pinged for with
    :mod:`.pings`); None for a model that sends every response inside ``execute``. Pings are
    answered either way (:meth:`answered`). ``spawn`` starts the hooks' thread."""

    def __init__(self, pb: Any, model: str, decoupled: bool, specs: Sequence[contract.TensorSpec] | None,
                 spawn: Spawn = start_thread) -> None:
        self.pb = pb
        self.pinger = Pinger(pb, model, specs, decoupled)
        self.finals = DeferredFinals(self.pinger.ping, spawn=spawn) if specs is not None else None
        self._owned: list[Closable] = []

    def started(self) -> None:
        """``start`` has built the model (:func:`~.unload.freeze_start_heap`)."""
        freeze_start_heap(self.pb)

    def owns(self, thing: Any) -> Any:
        """Register ``thing`` (metric families: a ``close()``) to be released at
        :meth:`finalize`, in registration order; returns it."""
        self._owned.append(thing)
        return thing

    def executing(self) -> contextlib.AbstractContextManager[None]:
        """Wrap ``execute``'s body."""
        return self.finals.executing() if self.finals is not None else contextlib.nullcontext()

    def answered(self, request: Any) -> bool:
        """Whether ``request`` was answered here (a ping): ``execute`` then skips it."""
        return self.pinger.answer(request)

    def sender(self, request: Any, sender: Any) -> Any:
        """The response sender the model uses for ``request`` (``sender``: its own)."""
        if self.finals is None:
            return sender
        return DeferredFinalSender(sender, self.finals, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def close(self) -> None:
        """First at unload (no ``execute`` comes any more): deferred finals go out at once from
        now on, the pinger stops."""
        if self.finals is not None:
            self.finals.close()
        self.pinger.close()

    def finalize(self) -> None:
        """Last at unload: release what :meth:`owns` holds, then collect the cyclic garbage."""
        owned, self._owned = self._owned, []
        release(owned)
        collect_cycles()


class EngineHooks(ModelHooks):
    """The GPT engine's: besides :class:`ModelHooks`, its cancel socket (:mod:`.cancels`,
    :meth:`listen_cancels`), a receipt after each response to an entry stub that asked for
    them (:mod:`.receipts`), and the iterator grave for its pings' iterators (:mod:`.grave`)."""

    def __init__(self, pb: Any, model: str, decoupled: bool, specs: Sequence[contract.TensorSpec] | None,
                 spawn: Spawn = start_thread) -> None:
        ITERATOR_GRAVE.acquire()  # its pings' iterators (released at finalize)
        super().__init__(pb, model, decoupled, specs, spawn)
        self.model = model
        self.receipts = ReceiptWriter()
        self.cancels: CancelListener | None = None

    def listen_cancels(self, cancel: Any) -> None:
        """Call ``cancel(stream_id)`` for each stream id the entry models send to this engine's
        cancel socket; without a socket, cancels arrive as control requests only."""
        try:
            self.cancels = CancelListener(cancel_address(self.model), cancel).start()
        except OSError as exc:
            log.warning("%s: no cancel socket (%s): cancels arrive as control requests only", self.model, exc)

    def sender(self, request: Any, sender: Any) -> Any:
        """A sequence that names its caller's receipt socket (``delivery_address``) and its
        ``stream_id`` gets a sender that writes a receipt after each response; a control request
        never does."""
        return super().sender(request, receipted(self.pb, request, sender, self.receipts))

    def close(self) -> None:
        super().close()
        if self.cancels is not None:
            self.cancels.close()

    def finalize(self) -> None:
        self.receipts.close()
        owned, self._owned = self._owned, []
        release(owned)
        ITERATOR_GRAVE.release(time.monotonic() + 1.0)
        collect_cycles()


class EntryHooks(ModelHooks):
    """The entry models': their runtime (:meth:`runtime`) holds this stub's receipt board
    (:mod:`.receipts`) and iterator grave (:mod:`.grave`), which the BLS stages use."""

    HELPERS: ClassVar[tuple[SharedHelper[Any], ...]] = (RECEIPT_BOARD, ITERATOR_GRAVE)

    @classmethod
    def runtime(cls) -> EntryRuntime:
        """A new entry runtime holding the stub's process-wide helpers."""
        return EntryRuntime(helpers=cls.HELPERS)


class EnsembleStepHooks(ModelHooks):
    """The ensemble's last step's: :meth:`relay_cancel` (:mod:`.ensemble`)."""

    def __init__(self, pb: Any, model: str, decoupled: bool, specs: Sequence[contract.TensorSpec] | None,
                 spawn: Spawn = start_thread) -> None:
        super().__init__(pb, model, decoupled, specs, spawn)
        self.model = model
        self.cancel_address = engine_cancel_address()

    def relay_cancel(self, stream_id: str, request_id: str) -> None:
        """A request Triton marked cancelled: cancel its engine sequence ``stream_id``."""
        relay_cancel(self.cancel_address, stream_id, self.model, request_id)

