"""The supervisor's decisions and the deep probe without a server: the restart policy; a
scripted stand-in for ``TritonServer`` restarted when a stub dies, when only the probe fails,
when its process exits or its log shows a crash, and a restart that fails; the probe's command
line against nothing listening and its usage errors; "server busy" counted healthy; the
profile's ``[health]`` table. Faults on real servers: tests/server/test_faults.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.client import ClientError, SynthesisRequest
from chattts_serving.deploy import supervisor as server_mod
from chattts_serving.deploy.probe import IndexUnreadable, ProbeResult, probe
from chattts_serving.deploy.server import ServerError
from chattts_serving.deploy.supervisor import CheckResult, RestartPolicy, Supervisor
from chattts_serving.serving.profile import PROFILES_DIR, HealthProfile, ProfileError, load_profile
from tests.support.probe_cli import probe_cli
from tests.support.servers import free_port


def test_restart_policy_restarts_after_consecutive_failures_only() -> None:
    p = RestartPolicy(failures=3, probe_every=0)
    bad, good = CheckResult(False, "x"), CheckResult(True)
    assert [p.record(r) for r in (bad, bad, good, bad, bad)] == [False] * 5
    assert p.record(bad) is True  # the third in a row
    assert p.consecutive_failures == 0 and p.checks == 0  # history reset for the new server
    assert not p.probe_due()


def test_restart_policy_probes_on_schedule_and_keeps_probing_while_the_probe_fails() -> None:
    p = RestartPolicy(failures=2, probe_every=3)
    due = []
    for _ in range(7):
        due.append(p.probe_due())
        p.record(CheckResult(True, probed=due[-1]))
    assert due == [True, False, False, True, False, False, True]
    # a failed probe: the next checks probe too, so passing cheap checks cannot reset the count
    assert p.record(CheckResult(False, "probe: synthesis", probed=True)) is False
    assert p.probe_due()
    assert p.record(CheckResult(False, "probe: synthesis", probed=True)) is True
    p = RestartPolicy(failures=3, probe_every=5)
    p.record(CheckResult(False, "probe", probed=True))
    assert p.probe_due()
    p.record(CheckResult(True, probed=True))  # the probe recovered: back to the schedule
    assert not p.probe_due() and p.consecutive_failures == 0


class _Proc:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self.pid = 0

    def poll(self) -> int | None:
        return self.returncode


class _FakeServer:
    """Duck-typed TritonServer: stub counts, a process and restart() are scripted."""

    http_port, grpc_port, address = 1, 2, "127.0.0.1"

    def __init__(self, fail_restart: bool = False, log_path: Path | None = None) -> None:
        self.proc: _Proc | None = _Proc()
        self.stubs = Counter({contract.MODEL_ENGINE: 1, contract.MODEL_OFFLINE: 2})
        self.restarts = 0
        self.stop_timeouts: list[float] = []
        self.fail_restart = fail_restart
        self.log_path = log_path

    def stub_counts(self) -> Counter[str]:
        return Counter(self.stubs)

    def stub_pids(self) -> dict[int, str]:
        return {}  # nothing to watch: the checks count stubs

    def restart(self, stop_timeout_s: float = 30.0) -> None:
        self.stop_timeouts.append(stop_timeout_s)
        if self.fail_restart:
            raise ServerError("port 1 is already in use")
        self.restarts += 1
        if self.proc is not None:
            self.proc.returncode = None
        self.stubs = Counter({contract.MODEL_ENGINE: 1, contract.MODEL_OFFLINE: 2})


@pytest.fixture()
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    got: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(server_mod, "log_event", lambda event, level="info", **f: got.append((event, f)))
    return got


def _supervisor(fake: _FakeServer, probes: list[bool], failures: int = 2, probe_every: int = 0,
                states: dict[str, str] | None = None) -> Supervisor:
    """A supervisor of ``fake`` whose probes answer ``probes`` in turn and whose repository index
    answers ``states`` (None: it cannot be read)."""
    answers = iter(probes)

    def fake_probe(http: str, grpc: str, timeout_s: float) -> ProbeResult:
        ok = next(answers)
        return ProbeResult(ok, "ok" if ok else "synthesis: Stub process 'chattts_gpt_0_0' is not healthy.")

    def fake_states() -> dict[str, str]:
        if states is None:
            raise IndexUnreadable("repository index: connection refused")
        return states

    health = HealthProfile(interval_s=0.01, failures=failures, probe_every=probe_every, probe_timeout_s=1.0)
    sup = Supervisor(fake, health, probe_fn=fake_probe, states_fn=fake_states)  # type: ignore[arg-type]
    sup.baseline()
    return sup


def test_supervisor_restarts_at_once_when_a_stub_dies_and_logs_each_event(
        events: list[tuple[str, dict[str, Any]]]) -> None:
    """A dead model process never comes back by itself (Triton 2.51 restarts no decoupled
    stub): the first check that misses it restarts the server, with the short stop."""
    fake = _FakeServer()
    sup = _supervisor(fake, [], failures=3)
    assert sup.step() is False and not events
    fake.stubs[contract.MODEL_OFFLINE] -= 1  # one of two instances died
    assert sup.step() is True and fake.restarts == 1
    assert events[0][0] == "health_check_failed" and "chattts_offline (1 of 2)" in events[0][1]["reason"]
    assert events[0][1]["failures_to_restart"] == 1
    assert [e for e, _ in events] == ["health_check_failed", "server_restarting", "server_restarted"]
    assert events[-1][1]["restarts"] == 1
    assert fake.stop_timeouts == [server_mod.FATAL_STOP_TIMEOUT_S]
    assert sup.step() is False  # the new server's stubs are the new baseline


@pytest.mark.parametrize("state", ["READY", None], ids=["index-says-ready", "index-unreadable"])
def test_a_missing_stub_whose_model_triton_calls_ready_or_cannot_tell_is_a_death(
        state: str | None, events: list[tuple[str, dict[str, Any]]]) -> None:
    fake = _FakeServer()
    sup = _supervisor(fake, [], failures=3, states=None if state is None else {contract.MODEL_ENGINE: state})
    fake.stubs[contract.MODEL_ENGINE] = 0
    assert sup.step() is True and fake.restarts == 1


@pytest.mark.parametrize("state", ["UNLOADING", "UNAVAILABLE"])
def test_a_model_the_admin_unloads_or_reloads_is_no_death(state: str, events: list[tuple[str, dict[str, Any]]]) -> None:
    """Explicit model control: a process that exits while its model unloads (or reloads) leaves
    the server serving; the processes as they are become the expected set, both ways."""
    fake = _FakeServer()
    states = {contract.MODEL_ENGINE: state, contract.MODEL_OFFLINE: "READY"}
    sup = _supervisor(fake, [], failures=1, states=states)
    fake.stubs[contract.MODEL_ENGINE] = 0
    assert sup.step() is False and fake.restarts == 0 and not events
    assert sup.expected[contract.MODEL_ENGINE] == 0
    fake.stubs[contract.MODEL_ENGINE] = 1  # loaded again: its new process is expected from now on
    states[contract.MODEL_ENGINE] = "READY"
    assert sup.step() is False and sup.expected[contract.MODEL_ENGINE] == 1
    fake.stubs[contract.MODEL_ENGINE] = 0  # and its death is a death again
    assert sup.step() is True and fake.restarts == 1


def test_supervisor_restarts_when_only_the_probe_fails(events: list[tuple[str, dict[str, Any]]]) -> None:
    fake = _FakeServer()
    # probe every 3 checks: ok, (cheap), (cheap), fail, fail -> restart on the second failed probe
    sup = _supervisor(fake, [True, False, False], failures=2, probe_every=3)
    assert [sup.step() for _ in range(5)] == [False, False, False, False, True]
    assert fake.restarts == 1
    assert "probe: synthesis" in events[0][1]["reason"] and events[0][1]["probed"] is True


def test_a_failed_restart_is_logged_and_tried_again_at_the_next_check(
        events: list[tuple[str, dict[str, Any]]]) -> None:
    """A restart that fails (a model that dies again while it loads, a port taken) does not end
    the supervisor: the next check finds the server still down and tries again."""
    fake = _FakeServer(fail_restart=True)
    sup = _supervisor(fake, [], failures=1)
    assert fake.proc is not None
    fake.proc.returncode = -9
    assert sup.step() is True and fake.restarts == 0
    assert "exit code -9" in events[0][1]["reason"]
    assert [e for e, _ in events] == ["health_check_failed", "server_restarting", "server_restart_failed"]
    assert events[-1][1]["retry_in_s"] == sup.health.interval_s
    fake.fail_restart = False
    assert sup.step() is True and fake.restarts == 1 and sup.restarts == 1
    assert [e for e, _ in events][-2:] == ["server_restarting", "server_restarted"]


def test_supervisor_restarts_a_dead_server_at_the_first_check_with_a_short_stop(
        events: list[tuple[str, dict[str, Any]]]) -> None:
    """A server process that exited needs no count of failed checks: restarted at once (the
    count is for a server that may come back by itself)."""
    fake = _FakeServer()
    sup = _supervisor(fake, [], failures=3)
    assert fake.proc is not None
    fake.proc.returncode = -6
    assert sup.step() is True and fake.restarts == 1
    assert fake.stop_timeouts == [server_mod.FATAL_STOP_TIMEOUT_S]
    assert [e for e, _ in events] == ["health_check_failed", "server_restarting", "server_restarted"]


def test_supervisor_restarts_at_once_a_live_server_whose_log_shows_a_crash(
        tmp_path: Path, events: list[tuple[str, dict[str, Any]]]) -> None:
    """Issue 28's state: tritonserver lives on after glibc found its heap corrupted (Triton's
    handler blocked), answering "ready" with no request completing. Its log says so: the first
    check after the line restarts it, whatever the stubs and the probe say. Lines written
    before the server's (re)start and the stop's own "Signal (2)" count for nothing."""
    log = tmp_path / "tritonserver.log"
    log.write_text("malloc(): unsorted double linked list corrupted\n")  # an earlier run's
    fake = _FakeServer(log_path=log)
    sup = _supervisor(fake, [], failures=3)
    assert sup.step() is False and not events
    with log.open("a") as f:
        f.write("Signal (2) received.\n{\"event\":\"corrupted words in our own JSON\"}\n")
    assert sup.step() is False and not events
    with log.open("a") as f:
        f.write("malloc(): unsorted double linked list corrupted\nSignal (6) received.\n")
    assert sup.step() is True and fake.restarts == 1
    assert "malloc(): unsorted double linked list corrupted" in events[0][1]["reason"]
    assert fake.stop_timeouts == [server_mod.FATAL_STOP_TIMEOUT_S]
    assert sup.step() is False  # read from the restart on


def test_probe_reports_an_unreachable_server_unhealthy_with_exit_code_1() -> None:
    dead = free_port()
    code, out = probe_cli("--http-url", f"127.0.0.1:{dead}", "--grpc-url", f"127.0.0.1:{dead}", "--timeout-s", "10")
    assert code == 1 and out["healthy"] is False and out["reason"].startswith("live:"), out
    assert set(out) == {"healthy", "reason", "checks", "duration_ms"}


def test_probe_usage_errors_exit_2() -> None:
    for args in (["--timeout-s", "0"], ["--timeout-s", "soon"], ["--nope"]):
        proc = subprocess.run([sys.executable, "-m", "chattts_serving.deploy.probe", *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
    with pytest.raises(ValueError):
        probe(timeout_s=0)


def test_probe_counts_busy_as_healthy_and_other_errors_as_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    import chattts_serving.client as client_pkg
    import chattts_serving.deploy.probe as probe_mod

    answers = {"": None}

    def fake_chunks(url: str, request: SynthesisRequest, timeout_s: float) -> Iterator[Any]:
        assert request.max_new_tokens == request.min_new_tokens == probe_mod.PROBE_TOKENS
        assert request.priority == "realtime"
        raise ClientError(answers[""] or "", None)
        yield

    monkeypatch.setattr(client_pkg, "iter_chunks", fake_chunks)
    answers[""] = "[busy] server busy: 64 streams already live"
    busy = probe_mod._check_synthesis("x:1", 1.0, "你好。")
    answers[""] = "[unavailable] server unavailable: engine is failing; not accepting work for 9.0 s more"
    broken = probe_mod._check_synthesis("x:1", 1.0, "你好。")
    assert busy["ok"] and busy["busy"]
    assert not broken["ok"] and "engine is failing" in broken["error"]


def test_health_table_is_validated_and_unknown_keys_fail(tmp_path: Path) -> None:
    base = (PROFILES_DIR / "cpu.toml").read_text()
    for bad, needle in ((base.replace("failures = 3 ", "failures = 0 "), "failures"),
                        (base.replace("interval_s = 5.0", "interval_s = 5.0\nrestart_budget = 2"), "restart_budget"),
                        (base.replace("[health]", "[healthz]"), "health")):
        path = tmp_path / "bad.toml"
        path.write_text(bad)
        with pytest.raises(ProfileError, match=needle):
            load_profile(path)
    for name in ("cpu", "gpu"):
        h = load_profile(name).health
        assert h.failures >= 1 and h.interval_s > 0 and h.probe_timeout_s > 0


def test_the_process_watch_records_which_process_exited_first() -> None:
    """A model process killed while tritonserver lives on wakes the watch alone, so that a
    server that aborts just after can be reported with its cause (Supervisor.check)."""
    from chattts_serving.deploy.supervisor import ProcessWatch

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        watch = ProcessWatch([p.pid for p in procs])
        procs[0].kill()
        procs[0].wait()
        assert watch.wait(10.0)
        assert watch.exited == [[procs[0].pid]]
        assert not watch.wait(0.05) and watch.exited == [[procs[0].pid]]
        procs[1].kill()
        procs[1].wait()
        assert watch.wait(10.0) and watch.exited == [[procs[0].pid], [procs[1].pid]]
        watch.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
