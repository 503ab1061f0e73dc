"""Follow Triton's admission watch: whether a door of the server is full, known before a request is sent.

The admission gate (``chattts_serving/gate/gate.cc``) serves :data:`contract.MODEL_ADMISSION`:
a decoupled model that answers a subscription at once with, for each door of
:data:`contract.ADMISSION_DOORS`, whether every slot is taken (output :data:`contract.ADM_FULL`),
and again each time a door fills or stops being full. :class:`AdmissionWatch` keeps one such
subscription per server address in the background, so that a front end (the OpenAI gateway)
answers "server busy" itself, without parsing the request or calling Triton, while every
server behind its target is full, and forwards again within one message of a slot being freed.

Why: a refusal that goes through the gateway and Triton costs the gateway a request parse and
a gRPC call in Python, about 2 to 3 CPU-ms here; a burst of 200 such refusals took 0.3 to 0.9 s
to come out on 2 cores (docs/performance.md, "Where the busy time goes"). A refusal decided from the watch
costs the HTTP parse alone.

What it promises: :meth:`AdmissionWatch.full` is True only while every reachable address of the
target has a live subscription whose last report says the door is full. An address that refuses
connections is left out (gRPC's round robin sends it no request either: ``localhost`` resolving
to ``::1`` beside a server that listens on IPv4 only). Anything else unknown (no watch model on
the server, an error, an address just added, a subscription silent for :data:`STALE_AFTER_S`
although the watch repeats its report every ``contract.ADMISSION_HEARTBEAT_S``) reads as not
full, so the request goes to Triton, whose gate decides as always. The window in which the two
disagree is the delivery time of one message: a request sent then is refused by the gate (not full here,
full there) or refused here while the slot that freed is being announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from .. import contract
from .aio import CHANNEL_ARGS
from .keys import grpc_metadata, key_refused, resolve_key

log = logging.getLogger("chattts_serving.client.admission")

RETRY_S: Final = 1.0
"""Pause before a subscription that ended or failed is made again, seconds."""
MISSING_RETRY_S: Final = 30.0
"""Pause before asking again a server that has no admission watch (gate off), seconds."""
RESOLVE_EVERY_S: Final = 30.0
"""How often the target's name is resolved again, seconds (Triton replicas come and go)."""
STALE_AFTER_S: Final = 3 * contract.ADMISSION_HEARTBEAT_S
"""A subscription that brings no report (not even the watch's heartbeat) for this long is taken
for dead: its last report is forgotten and it is made again (a server gone without closing
the connection must not leave a "full" behind)."""
_OPAQUE_SCHEMES: Final = ("unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")
_UNKNOWN_MODEL: Final = "Request for unknown model"
"""Triton's error for a model it does not serve (here: a server without the gate)."""


def target_host_port(url: str) -> tuple[str, int] | None:
    """(host, port) whose addresses a gRPC ``dns`` target resolves to: ``host:port``,
    ``dns:///host:port`` or ``dns:host:port`` (IPv6 literals in brackets; port 443 when none
    is given, as gRPC's). None for a target of another scheme (``unix:...``, ``ipv4:...``),
    which is watched as it is."""
    target = url.strip()
    if target.startswith(_OPAQUE_SCHEMES) or ("://" in target and not target.startswith("dns:///")):
        return None
    target = target.removeprefix("dns:///").removeprefix("dns:")
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = target.rpartition(":") if target.count(":") == 1 else (target, "", "")
    if not host:
        return None
    try:
        return host, int(port) if port else 443
    except ValueError:
        return None


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class AdmissionWatch:
    """Which doors of the Triton server(s) at ``url`` are full, followed in the background.

    ``url`` is the gRPC target the requests go to (``host:port`` or ``dns:///name:port``):
    every address its host resolves to gets a subscription of its own (requests are spread over
    all of them round robin, so a door is full only when it is full on every one). With
    ``shared`` (the requests' own client, e.g. :attr:`AioStreamClient.grpc_client`), a target
    that resolves to one address is watched over the requests' connection, so that behind an
    address that balances connections over several servers (a Kubernetes ClusterIP) the watch
    reports on the server the requests reach. ``inference_key``: the subscription is an
    inference request and carries the key (default: the configured one,
    :func:`~chattts_serving.client.keys.resolve_key`); a refused key is logged and the server's
    state stays unknown (not full) and it is asked again after ``missing_retry_s``. Call
    :meth:`start` inside the running event loop and :meth:`close` at shutdown.
    """

    def __init__(self, url: str, *, shared: grpcaio.InferenceServerClient | None = None, retry_s: float = RETRY_S,
                 missing_retry_s: float = MISSING_RETRY_S, resolve_every_s: float = RESOLVE_EVERY_S,
                 stale_after_s: float = STALE_AFTER_S, inference_key: str | None = None) -> None:
        self.url = url
        self._metadata = grpc_metadata(resolve_key(inference_key))
        self._said_key = False
        self._shared = shared
        self.retry_s, self.missing_retry_s, self.resolve_every_s = retry_s, missing_retry_s, resolve_every_s
        self.stale_after_s = stale_after_s
        self._addresses: frozenset[str] = frozenset()
        self._full: dict[str, tuple[bool, ...]] = {}
        """The last report of each address with a live subscription."""
        self._unreachable: set[str] = set()
        """Addresses whose last subscription attempt found no server (gRPC UNAVAILABLE)."""
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._retired: set[asyncio.Task[None]] = set()
        """Followers cancelled for addresses that went away, awaited by :meth:`close`."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start following (inside the running event loop); later calls do nothing."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name="admission-watch")

    async def close(self) -> None:
        """Cancel every subscription and wait until they are gone."""
        tasks = [t for t in (self._task, *self._followers.values(), *self._retired) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._followers.clear()
        self._full.clear()

    def full(self, door: str = contract.MODEL_STREAM) -> bool:
        """Whether ``door`` (of :data:`contract.ADMISSION_DOORS`) is full on every reachable
        address of the target, as last reported; False when none is reachable or any reachable
        one's state is unknown. Raises ValueError for a door the watch does not report on."""
        i = contract.ADMISSION_DOORS.index(door)
        reachable = [a for a in self._addresses if a not in self._unreachable]
        return bool(reachable) and all(len(f := self._full.get(a, ())) > i and f[i] for a in reachable)

    def describe(self) -> dict[str, Any]:
        """For health pages: addresses, how many have a live subscription and how many refuse
        connections, and :meth:`full` per door."""
        return {"addresses": len(self._addresses), "watched": len(self._full),
                "unreachable": len(self._unreachable & self._addresses),
                "full": {door: self.full(door) for door in contract.ADMISSION_DOORS}}

    async def _resolve(self) -> frozenset[str]:
        """Every ``ip:port`` the target resolves to; the target itself when it is not a name to
        resolve, and the last known set (or the target) when resolution fails."""
        hp = target_host_port(self.url)
        if hp is None:
            return frozenset({self.url})
        host, port = hp
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(host)
            return frozenset({_address(host, port)})
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            log.warning("admission watch: cannot resolve %s (%s); keeping %d address(es)", host, exc,
                        len(self._addresses))
            return self._addresses or frozenset({self.url})
        return frozenset(_address(str(info[4][0]), port) for info in infos) or frozenset({self.url})

    async def _supervise(self) -> None:
        try:
            while True:
                addresses = await self._resolve()
                shared = self._shared if len(addresses) == 1 else None
                for address, task in list(self._followers.items()):
                    if address not in addresses or task.done():  # gone, or ended by a bug (logged)
                        self._followers.pop(address).cancel()
                        self._retired.add(task)
                        task.add_done_callback(self._retired.discard)
                        self._full.pop(address, None)
                        self._unreachable.discard(address)
                for new in addresses - set(self._followers):
                    self._followers[new] = asyncio.get_running_loop().create_task(self._follow(new, shared))
                self._addresses = addresses
                await asyncio.sleep(self.resolve_every_s)
        finally:
            self._addresses = frozenset()

    def _key_refused(self, address: str, message: str) -> bool:
        """Whether ``message`` refuses the inference key; says so once in the log."""
        if not key_refused(message):
            return False
        if not self._said_key:
            log.warning("admission watch: %s: inference key required (%s); the watch stays off, every request "
                        "goes to Triton", address, "the key sent was refused" if self._metadata else "none is set")
            self._said_key = True
        return True

    async def _follow(self, address: str, shared: grpcaio.InferenceServerClient | None = None) -> None:
        """Keep one subscription to ``address`` open, recording each report; made again after
        :attr:`retry_s` when it ends, fails or brings nothing for :attr:`stale_after_s`
        (:attr:`missing_retry_s` when the server has had no watch model from the start: a gate
        turned off. A server that is stopping unloads the watch too; it is asked again after
        :attr:`retry_s`, so that its restart is seen at once). Over ``shared`` when given (then
        not closed here), else over a channel of its own to ``address``."""
        client = shared if shared is not None else grpcaio.InferenceServerClient(address, channel_args=CHANNEL_ARGS)

        async def subscribe() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": contract.MODEL_ADMISSION, "inputs": []}

        answered = False  # a subscription to this address has had a report: it serves the watch
        said_missing = False
        try:
            while True:
                pause = self.retry_s
                responses = None
                try:
                    responses = client.stream_infer(subscribe(), headers=self._metadata)
                    while True:
                        try:
                            result, error = await asyncio.wait_for(responses.__anext__(), self.stale_after_s)
                        except StopAsyncIteration:
                            break
                        if error is not None:
                            raise error
                        full = result.as_numpy(contract.ADM_FULL.name)
                        self._full[address] = tuple(bool(x) for x in full) if full is not None else ()
                        self._unreachable.discard(address)
                        answered = True
                except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11 (the image's 3.10)
                    log.warning("admission watch: no report from %s for %g s; subscribing again", address,
                                self.stale_after_s)
                except grpc.aio.AioRpcError as exc:
                    if self._key_refused(address, exc.details() or ""):
                        self._unreachable.discard(address)  # it answered
                        pause = self.missing_retry_s
                    elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                        self._unreachable.add(address)
                    else:
                        self._unreachable.discard(address)
                    log.debug("admission watch: %s: %s", address, exc.details())
                except InferenceServerException as exc:
                    self._unreachable.discard(address)  # it answered
                    if self._key_refused(address, exc.message() or ""):
                        pause = self.missing_retry_s
                    elif _UNKNOWN_MODEL in (exc.message() or "") and not answered:  # not a server stopping
                        pause = self.missing_retry_s
                        if not said_missing:
                            log.info("admission watch: %s has no %s model; every request goes to Triton (asking "
                                     "again every %g s)", address, contract.MODEL_ADMISSION, self.missing_retry_s)
                            said_missing = True
                    else:
                        log.debug("admission watch: %s: %s", address, exc.message())
                except Exception:  # a bug must not end the follower: the address stays unknown (not full)
                    log.exception("admission watch: %s: unexpected error; subscribing again", address)
                finally:
                    self._full.pop(address, None)
                    if responses is not None:
                        responses.cancel()  # a call still open (a timeout, an error) ends here
                await asyncio.sleep(pause)
        finally:
            if shared is None:
                with contextlib.suppress(Exception):
                    await client.close()
