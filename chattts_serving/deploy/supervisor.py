"""The supervisor of ``chattts-serve`` and of the image's command: restarts a
:class:`~chattts_serving.deploy.server.TritonServer` whose model process died, whose process
exited or crashed, or that stopped serving.

Triton 2.51 neither restarts a dead Python-backend stub (of any model) nor reports it in its
health (docs/triton-workarounds.md, "stuck model, nobody says so"): the streams that stub
served would wait until a stall timeout. The supervisor therefore watches every stub process
and the server process through Linux process file descriptors (``pidfd_open``), so a death is
seen the moment it happens, not at the next check; it then gives the server
:data:`FATAL_STOP_TIMEOUT_S` to stop, kills it (every client still connected learns at once
that its connection dropped, a retryable error, instead of waiting out Triton's exit timeout
for the dead model) and starts a fresh server on the same ports.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..serving.logs import log_event
from ..serving.profile import HealthProfile
from .logscan import LogScanner
from .probe import IndexUnreadable, ProbeResult, model_states, probe
from .server import ServerError, TritonServer, connect_host


class ServerStopped(ServerError):
    """Raised by the restart of a server that is stopped for good instead (a container's, which
    its orchestrator restarts: :mod:`chattts_serving.deploy.container`)."""


@dataclass(frozen=True)
class CheckResult:
    """One supervisor check: ``ok``, the ``reason`` when not ok ("ok" otherwise), whether the
    deep probe ran as part of it (``probed``), and whether the failure calls for a restart at
    once (``fatal``: the process exited, a model process died, or the log shows a crash or a
    corrupted heap)."""

    ok: bool
    reason: str = "ok"
    probed: bool = False
    fatal: bool = False


class RestartPolicy:
    """When to probe and when to restart, from the results of successive checks (no I/O).

    Check ``n`` (0-based since the last start) includes the deep probe when ``n`` is a multiple
    of ``probe_every`` (never when it is 0) and, once a probe has failed, on every check until
    one passes: otherwise the cheap checks in between would reset the count of a server
    that is up but cannot synthesise. ``failures`` consecutive failed checks call for a
    restart; any passing check resets the count.
    """

    def __init__(self, failures: int, probe_every: int) -> None:
        if failures < 1 or probe_every < 0:
            raise ValueError(f"need failures >= 1 and probe_every >= 0, got {failures}, {probe_every}")
        self.failures = failures
        self.probe_every = probe_every
        self.reset()

    def reset(self) -> None:
        """Forget the history (the server was just (re)started)."""
        self.checks = 0
        self.consecutive_failures = 0
        self.probe_failing = False

    def probe_due(self) -> bool:
        """Whether the next check should include the deep probe."""
        if self.probe_every == 0:
            return False
        return self.probe_failing or self.checks % self.probe_every == 0

    def record(self, result: CheckResult) -> bool:
        """Count ``result``; True when the server should be restarted now (the history is
        then reset)."""
        self.checks += 1
        if result.probed:
            self.probe_failing = not result.ok
        if result.ok:
            self.consecutive_failures = 0
            return False
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.failures:
            self.reset()
            return True
        return False


FATAL_STOP_TIMEOUT_S = 1.0
"""How long a supervisor lets a broken server (a model process dead, the process crashed or its
heap corrupted) stop by itself before killing it. Short on purpose: such a server never
finishes a clean stop (a dead model never unloads; Triton waits for open HTTP connections
before it unloads anything), the models that still work tell their streams within this time
where they can (docs/operations.md, "Faults and recovery"), and the kill tells every other
client at once (its connection drops: a retryable error) instead of after the exit timeout."""

INDEX_TIMEOUT_S = 2.0
"""How long a supervisor waits for the repository index when a model process has gone (to tell
a death from an unload): a server that cannot answer this in time counts it as a death."""

WAKE_S = 0.25
"""Longest a supervisor sleeps between looks at its stop flag."""


class ProcessWatch:
    """Process file descriptors (``os.pidfd_open``) of a set of processes: :meth:`wait` returns
    as soon as one of them exits (Linux 5.3 and later; elsewhere, or for a process that is
    already gone, it only sleeps and the next check finds the death)."""

    def __init__(self, pids: list[int]) -> None:
        self._poll = select.poll()
        self._fds: list[int] = []
        self._pid_of: dict[int, int] = {}
        self.exited: list[list[int]] = []
        """The watched processes seen exiting, one list per wake in the order of the wakes
        (processes in one list exited too close together to order)."""
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                continue
            self._fds.append(fd)
            self._pid_of[fd] = pid
            self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True when a watched process exited meanwhile (it is then
        watched no more, and recorded in :attr:`exited`)."""
        if not self._fds:
            time.sleep(timeout_s)
            return False
        fired = self._poll.poll(max(0, int(timeout_s * 1000)))
        for fd, _ in fired:
            self._poll.unregister(fd)
        if fired:
            self.exited.append([self._pid_of[fd] for fd, _ in fired])
        return bool(fired)

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


class Supervisor:
    """Restarts a :class:`~chattts_serving.deploy.server.TritonServer` whose model processes
    died or that stopped serving.

    The server process and every stub process present right after its start are watched
    (:class:`ProcessWatch`): a death wakes the supervisor at once, and a missing stub, an exited
    server or a crash in its log (:mod:`~chattts_serving.deploy.logscan`: a process in that state
    may live on and answer "ready" while serving nothing) restarts the server at that check,
    its stop cut short (:data:`FATAL_STOP_TIMEOUT_S`).
    Besides, every ``health.interval_s`` seconds it checks the same and, when
    :class:`RestartPolicy` says so, runs the deep probe (:func:`chattts_serving.deploy.probe.probe`,
    deadline ``health.probe_timeout_s``); ``health.failures`` failed probes in a row restart
    the server (clean stop, same ports). Every event is one JSON log line on stderr
    (:func:`chattts_serving.serving.logs.log_event`): ``supervisor_started``,
    ``health_check_failed``, ``server_restarting``, ``server_restarted``, ``server_restart_failed``
    (``server_stopped`` for a container's server, :class:`ServerStopped`).

    A model process that exits while the admin unloads or reloads its model (explicit model
    control) is no death: Triton's repository index then says UNLOADING or UNAVAILABLE, not
    READY, and the processes as they are become the expected set.

    ``probe_fn(http_url, grpc_url, timeout_s)`` and ``states_fn()`` (each model's state, or
    IndexUnreadable) can be replaced in tests.
    """

    def __init__(self, server: TritonServer, health: HealthProfile,
                 probe_fn: Callable[[str, str, float], ProbeResult] | None = None,
                 states_fn: Callable[[], dict[str, str]] | None = None) -> None:
        self.server = server
        self.health = health
        self.host = connect_host(server.address)
        """Where this machine reaches the server's ports (loopback for a wildcard bind)."""
        self.policy = RestartPolicy(health.failures, health.probe_every)
        self.probe_fn = probe_fn or (lambda http, grpc, timeout: probe(http, grpc, timeout,
                                                                       admin_token=server.admin_token))
        self.states_fn = states_fn or (lambda: model_states(f"{self.host}:{server.http_port}", INDEX_TIMEOUT_S,
                                                            server.admin_token))
        self.expected: Counter[str] = Counter()
        self.restarts = 0
        self.log = LogScanner(server.log_path)
        self._stub_models: dict[int, str] = {}
        self._watch = ProcessWatch([])

    def baseline(self) -> None:
        """Record the stub processes of the freshly started server as the expected set and
        watch them and the server; the log is read from its current end on (a restart appends)."""
        self.policy.reset()
        self.log = LogScanner(self.server.log_path, start_at_end=True)
        self._watch_stubs()

    def _watch_stubs(self) -> None:
        """Expect and watch the server's stub processes as they are now."""
        self.expected = self.server.stub_counts()
        pids = self.server.stub_pids()
        self._stub_models = dict(pids)
        self._watch.close()
        proc = self.server.proc
        self._watch = ProcessWatch([*pids, *([proc.pid] if proc is not None and proc.pid else [])])

    def _died(self, missing: Counter[str]) -> Counter[str]:
        """Of the models whose processes are ``missing``, those that died: Triton still calls
        them READY (a process of a model the admin unloads, or reloads, exits too, and its model
        is then UNLOADING or UNAVAILABLE). All of them when the index cannot be read."""
        try:
            states = self.states_fn()
        except IndexUnreadable:
            return missing
        return Counter({model: n for model, n in missing.items() if states.get(model, "READY") == "READY"})

    def _first_dead_models(self) -> str:
        """The models (comma-separated) whose watched processes were the first to exit, seen
        exiting before the server itself; empty when the server went first or with them."""
        if not self._watch.exited:
            return ""
        first = self._watch.exited[0]
        if any(pid not in self._stub_models for pid in first):
            return ""
        return ", ".join(sorted({self._stub_models[pid] for pid in first}))

    def check(self, with_probe: bool) -> CheckResult:
        """The server process runs, every expected stub is alive and, ``with_probe``, the
        deep probe passes."""
        proc = self.server.proc
        signs = self.log.new_fatal_lines()
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            why = f"; its log: {signs[0][:200]}" if signs else ""
            first = self._first_dead_models()
            if first:  # Triton can abort when a model process dies under it: name the cause
                return CheckResult(False, f"model process(es) died: {first}, then tritonserver exited "
                                          f"(exit code {code}){why}", fatal=True)
            return CheckResult(False, f"tritonserver is not running (exit code {code}){why}", fatal=True)
        if signs:
            return CheckResult(False, f"the server log shows a crash: {signs[0][:200]}", fatal=True)
        current = self.server.stub_counts()
        missing = self.expected - current
        if missing:
            died = self._died(missing)
            if died:
                gone = ", ".join(f"{model} ({n} of {self.expected[model]})" for model, n in sorted(died.items()))
                return CheckResult(False, f"model process(es) died: {gone}", fatal=True)
        if current != self.expected:  # the admin unloaded or (re)loaded models: their processes are the new normal
            self._watch_stubs()
        if not with_probe:
            return CheckResult(True)
        res = self.probe_fn(f"{self.host}:{self.server.http_port}", f"{self.host}:{self.server.grpc_port}",
                            self.health.probe_timeout_s)
        return CheckResult(res.healthy, "ok" if res.healthy else f"probe: {res.reason}", probed=True)

    def step(self, with_probe: bool | None = None) -> bool:
        """One check (with the deep probe when the policy says so, or as ``with_probe`` says),
        and a restart when the policy calls for one; True when it restarted or tried to. A
        restart that fails (a model that dies again while it loads, a port taken) is logged and
        tried again at the next check, every ``health.interval_s``: the supervisor never gives
        up on its server. Raises :class:`ServerStopped` when the server's restart stops it for
        good (a container's)."""
        result = self.check(self.policy.probe_due() if with_probe is None else with_probe)
        if result.ok:
            self.policy.record(result)
            return False
        log_event("health_check_failed", level="warning", component="supervisor", reason=result.reason,
                  probed=result.probed, consecutive_failures=self.policy.consecutive_failures + 1,
                  failures_to_restart=1 if result.fatal else self.health.failures)
        if not self.policy.record(result) and not result.fatal:
            return False
        log_event("server_restarting", level="error", component="supervisor", reason=result.reason,
                  restarts=self.restarts)
        t0 = time.monotonic()
        try:
            self.server.restart(stop_timeout_s=FATAL_STOP_TIMEOUT_S if result.fatal else 30.0)
        except ServerStopped as exc:
            log_event("server_stopped", level="error", component="supervisor", reason=result.reason, detail=str(exc))
            raise
        except ServerError as exc:  # tried again at the next check: its server is not running
            log_event("server_restart_failed", level="error", component="supervisor", error=str(exc).splitlines()[0],
                      retry_in_s=self.health.interval_s)
            return True
        self.restarts += 1
        self.baseline()
        log_event("server_restarted", component="supervisor", reason=result.reason, restarts=self.restarts,
                  duration_ms=round((time.monotonic() - t0) * 1000, 1), stubs=dict(self.expected))
        return True

    def run(self, stop: threading.Event | None = None) -> None:
        """Check every ``interval_s`` seconds, and at once when a watched process exits, until
        ``stop`` is set (forever without one). Raises :class:`ServerStopped` as :meth:`step`."""
        stop = stop or threading.Event()
        self.baseline()
        log_event("supervisor_started", component="supervisor", interval_s=self.health.interval_s,
                  failures=self.health.failures, probe_every=self.health.probe_every,
                  probe_timeout_s=self.health.probe_timeout_s, stubs=dict(self.expected))
        try:
            next_check = time.monotonic() + self.health.interval_s
            while not stop.is_set():
                died = self._watch.wait(min(WAKE_S, max(0.0, next_check - time.monotonic())))
                if stop.is_set():  # the server is being stopped on purpose: its processes exit
                    break
                if died:
                    self.step(with_probe=False)
                elif time.monotonic() >= next_check:
                    self.step()
                else:
                    continue
                next_check = time.monotonic() + self.health.interval_s
        finally:
            self._watch.close()


def supervise(server: TritonServer, health: HealthProfile, stop: threading.Event | None = None) -> None:
    """Run a :class:`Supervisor` over the (started) ``server`` until ``stop`` is set."""
    Supervisor(server, health).run(stop)


@contextlib.contextmanager
def supervised(server: TritonServer, health: HealthProfile) -> Iterator[Supervisor]:
    """A :class:`Supervisor` over the (started) ``server`` on a thread of its own for the
    duration of the ``with`` block (``chattts-demo``)."""
    stop = threading.Event()
    sup = Supervisor(server, health)
    thread = threading.Thread(target=sup.run, args=(stop,), name="supervisor", daemon=True)
    thread.start()
    try:
        yield sup
    finally:
        stop.set()
        thread.join(health.interval_s + health.probe_timeout_s + 5)
