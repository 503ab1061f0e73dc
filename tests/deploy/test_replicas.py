"""Two Triton replicas behind haproxy, under load: one lost, one drained, all restarted in turn,
one full; saved voices shared through PostgreSQL; time to first audio through the balancer.

Every request gets one outcome (tests/deploy/load.py): completed, failed with an explicit error,
or lost (the client waited past the stall timeout, or it never ended). Lost must be 0 in every
case, failed 0 wherever no replica dies. Each case's figures go into the fleet's results file.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from chattts_serving.deploy.drain import active_requests
from chattts_serving.gateway import GatewaySettings
from tests.support.pg import PgServer, running_pg
from tests.support.servers import SAME_PCM16_LSB, pcm16_gap, running_gateway

from .conftest import MAX_STREAMS, Fleet
from .fleet import Replica
from .load import IDLE_TIMEOUT_S, Load, Outcome, counts, one_request, ttfa_ratio

TOKENS = 48
"""Tokens per stream under load: a stream of about 1 s of audio that runs a few seconds here."""
DRAIN_TOKENS = 4 * TOKENS
"""Tokens per stream in the drain and rolling cases: long enough that the drained replica
nearly always has one in flight when it is taken out."""
LONG_TOKENS = 1500
"""Tokens of the streams that hold admission slots in the busy case (cancelled when done)."""
CANCEL_FREES_S = 30.0
"""Longest wait for every slot of a replica to be free after its clients cancelled their
streams through the balancer (the cancel reaches the server as the stream's reset)."""
STALL_TIMEOUT_S = 60.0
"""The profile's ``entry.stall_timeout_s``: no client may wait longer than this for its error."""


def _streams(fleet: Fleet, replica: Replica) -> int:
    return int(fleet.lb.servers()[replica.name]["scur"])


def _total(fleet: Fleet, replica: Replica) -> int:
    return int(fleet.lb.servers()[replica.name]["stot"])


def _wait(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _errors(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [{"kind": o.kind, "status": o.status, "message": o.message} for o in outcomes if o.result == "error"][:10]


def test_sigkill_one_replica_mid_stream(fleet: Fleet) -> None:
    """The replica's streams end with an explicit unavailable error well within the stall
    timeout, haproxy marks it down within its check interval, every request sent after that
    completes on the other replica (the only failures are the victim's streams and requests
    that reached it before it was marked down), nothing is lost; the replica comes back and is
    balanced to."""
    victim = fleet.replicas[0]
    load = Load(fleet.lb.grpc_url, concurrency=2, tokens=TOKENS)
    try:
        load.wait_completed(4)
        _wait(lambda: _streams(fleet, victim) >= 1, 30, "a stream on the victim")
        in_flight = _streams(fleet, victim)
        killed = time.monotonic()
        fleet.backend.kill(victim)
        down_s = fleet.lb.wait_status(victim.name, "DOWN", 30)
        exit_code = fleet.backend.wait_exit(victim)
        time.sleep(3.0)  # the load runs on, on one replica
    finally:
        outcomes = load.stop()
    fleet.backend.restart(victim)
    back_s = fleet.put_back(victim)
    c = counts(outcomes)
    failed = [o for o in outcomes if o.result == "error"]
    after_down = [o for o in outcomes if o.sent > killed + down_s]
    first_ok = min((o.ended - killed for o in outcomes if o.sent > killed and o.result == "completed"
                    and o.ended is not None), default=None)
    slowest_error_s = max((o.ended - killed for o in failed if o.ended is not None), default=0.0)
    fleet.cases["sigkill_one_replica"] = {
        **c, "streams_on_victim_at_kill": in_flight, "victim_exit_code": exit_code,
        "time_to_reroute_s": round(down_s, 3),
        "kill_to_first_new_request_completed_s": None if first_ok is None else round(first_ok, 3),
        "kill_to_last_error_s": round(slowest_error_s, 3), "victim_back_in_s": round(back_s, 3),
        "sent_after_marked_down": len(after_down), "errors": _errors(outcomes)}
    assert c["lost"] == 0, fleet.cases["sigkill_one_replica"]
    assert exit_code == 70, "chattts-tritonserver ends with 70 when its server dies"
    assert all(o.kind == "unavailable" for o in failed), _errors(outcomes)
    assert slowest_error_s < STALL_TIMEOUT_S
    assert after_down and all(o.result == "completed" for o in after_down), _errors(after_down)
    # a request fails only if it was on the victim or reached it before haproxy's health check
    # marked it down (haproxy refuses those with REFUSED_STREAM): never one sent after that
    marked_down = killed + down_s
    assert all(o.sent <= marked_down for o in failed), [(round(o.sent - killed, 3), o.message) for o in failed]
    before = _total(fleet, victim)
    load = Load(fleet.lb.grpc_url, concurrency=2, tokens=TOKENS)
    try:
        load.wait_completed(4)
    finally:
        again = counts(load.stop())
    assert _total(fleet, victim) > before, "the restarted replica is balanced to again"
    assert again["failed_explicit"] == again["lost"] == 0, again


def _drain_one(fleet: Fleet, replica: Replica) -> dict[str, Any]:
    """Take ``replica`` out of the balancer, run the preStop drain in it and stop it, start it
    again and put it back: a rolling update's step. Returns what happened."""
    _wait(lambda: _streams(fleet, replica) >= 1, 60, f"a stream on {replica.name}")
    fleet.take_out(replica)
    streams = _streams(fleet, replica)  # those that must finish there
    reroute_s = fleet.lb.wait_status(replica.name, "DRAIN", 10)
    status = fleet.lb.status(replica.name)
    total = _total(fleet, replica)
    triton_ready = replica.ready()
    drained = fleet.backend.drain(replica)
    new_streams = _total(fleet, replica) - total
    fleet.backend.restart(replica)
    back_s = fleet.put_back(replica)
    return {"time_to_reroute_s": round(reroute_s, 3), "streams_in_flight_at_drain": streams,
            "balancer_status_while_draining": status,
            "triton_ready_while_draining": triton_ready, "new_streams_while_draining": new_streams,
            "drain": drained, "back_in_s": round(back_s, 3)}


def test_drain_one_replica_as_prestop_does(fleet: Fleet) -> None:
    """Out of the balancer (its endpoint no longer ready), the streams in flight on it complete,
    the drain returns drained, the SIGTERM after it ends the replica cleanly; zero failed."""
    victim = fleet.replicas[1]
    load = Load(fleet.lb.grpc_url, concurrency=2, tokens=DRAIN_TOKENS)
    try:
        load.wait_completed(2)
        step = _drain_one(fleet, victim)
        load.wait_completed(len(load.outcomes) + 2)
    finally:
        outcomes = load.stop()
    c = counts(outcomes)
    fleet.cases["drain_one_replica"] = {**c, **step, "errors": _errors(outcomes)}
    assert c["failed_explicit"] == 0 and c["lost"] == 0, fleet.cases["drain_one_replica"]
    assert step["balancer_status_while_draining"].startswith("DRAIN")
    assert step["streams_in_flight_at_drain"] >= 1
    assert step["new_streams_while_draining"] == 0
    assert step["drain"]["drained"] is True and step["drain"]["exit_code"] == 0, step


def test_rolling_restart_of_every_replica(fleet: Fleet) -> None:
    """Each replica in turn drained, stopped, started and put back, under load: zero failed."""
    load = Load(fleet.lb.grpc_url, concurrency=2, tokens=DRAIN_TOKENS)
    steps = []
    started = time.monotonic()
    try:
        load.wait_completed(2)
        for replica in fleet.replicas:
            steps.append({"replica": replica.name, **_drain_one(fleet, replica)})
            load.wait_completed(sum(o.result == "completed" for o in load.outcomes) + 2)
    finally:
        outcomes = load.stop()
    c = counts(outcomes)
    fleet.cases["rolling_restart"] = {**c, "replicas_restarted": len(steps),
                                      "time_to_reroute_s": max((s["time_to_reroute_s"] for s in steps), default=None),
                                      "duration_s":
                                      round(time.monotonic() - started, 1), "steps": steps,
                                      "errors": _errors(outcomes)}
    assert c["failed_explicit"] == 0 and c["lost"] == 0, fleet.cases["rolling_restart"]
    assert all(s["drain"]["drained"] and s["new_streams_while_draining"] == 0 for s in steps), steps


def _one(fleet: Fleet) -> Outcome:
    return one_request(fleet.lb.grpc_url, TOKENS)


PROBE_TRIES = 3
"""Times the busy case sends its probe before it gives up on holding the slots still."""


def _probe_while_held(fleet: Fleet, holders: Load, held: Any, what: str) -> Outcome:
    """One request through the balancer while ``held()`` is true of the replicas' slots. When a
    holder's stream ended while the probe ran, the slots it tested were not all held (the holder
    sends its next stream a moment later), so the probe is sent again, up to
    :data:`PROBE_TRIES` times."""
    for _ in range(PROBE_TRIES):
        _wait(held, 60, what)
        ended = len(holders.outcomes)
        probe = _one(fleet)
        if len(holders.outcomes) == ended:
            return probe
    raise AssertionError(f"a holder's stream ended during each of {PROBE_TRIES} probes ({what})")


def test_one_replica_full_is_served_both_full_is_busy_at_once(fleet: Fleet) -> None:
    """With one replica's every slot taken and one free on the other, a request through the
    balancer is served (leastconn sends it to the free slot); with every slot of both taken it
    is refused busy at once."""
    holders = Load(fleet.lb.grpc_url, concurrency=2 * MAX_STREAMS - 1, tokens=LONG_TOKENS)
    try:
        _wait(lambda: sum(_streams(fleet, r) for r in fleet.replicas) == 2 * MAX_STREAMS - 1, 60, "the holders")
        served = _probe_while_held(
            fleet, holders, lambda: sorted(active_requests(r.metrics_url) for r in fleet.replicas)
            == [MAX_STREAMS - 1, MAX_STREAMS], "one replica full")
    finally:
        holders.cancel()
    holders = Load(fleet.lb.grpc_url, concurrency=2 * MAX_STREAMS, tokens=LONG_TOKENS)
    try:
        refused = _probe_while_held(
            fleet, holders, lambda: all(active_requests(r.metrics_url) == MAX_STREAMS for r in fleet.replicas),
            "both full")
    finally:
        holders.cancel()
    cancelled = time.monotonic()
    _wait(lambda: all(active_requests(r.metrics_url) == 0 for r in fleet.replicas), CANCEL_FREES_S,
          "the cancelled holders' slots to be freed on both replicas")
    busy_s = None if refused.ended is None else refused.ended - refused.sent
    probes = [served, refused]
    fleet.cases["one_full_then_both_full"] = {
        **counts(probes),
        "one_full": {"result": served.result, "kind": served.kind},
        "both_full": {"result": refused.result, "kind": refused.kind, "answered_in_s": busy_s},
        "slots_freed_after_client_cancel_s": round(time.monotonic() - cancelled, 3)}
    assert served.result == "completed", (served.kind, served.message)
    assert refused.result == "error" and refused.kind == "busy", (refused.kind, refused.message)
    assert busy_s is not None and busy_s < IDLE_TIMEOUT_S


@pytest.fixture(scope="module")
def pg() -> Any:
    yield from running_pg()


def test_a_voice_saved_through_one_gateway_speaks_on_every_replica(fleet: Fleet, pg: PgServer) -> None:
    """Two gateways on one PostgreSQL, both pointed at the balancer: a voice saved through one is
    spoken through the other by both replicas, the same audio."""
    settings = GatewaySettings(triton_url=fleet.lb.grpc_url, voice_store=pg.url, admission_watch=False)
    body = {"model": "chattts", "input": "你好，今天天气很好。", "seed": 9, "max_new_tokens": 16,
            "min_new_tokens": 16, "response_format": "pcm", "voice": "fleet-voice"}
    before = {r.name: _total(fleet, r) for r in fleet.replicas}
    with running_gateway(settings) as a, running_gateway(settings) as b:
        saved = httpx.post(f"{a}/v1/audio/voices", json={"name": "fleet-voice", "seed": 1234}, timeout=60)
        assert saved.status_code == 201, saved.text
        audio = []
        for _ in range(4):
            r = httpx.post(f"{b}/v1/audio/speech", json=body, timeout=120)
            assert r.status_code == 200, r.text
            audio.append(r.content)
        httpx.delete(f"{a}/v1/audio/voices/fleet-voice", timeout=30)
    per_replica = {r.name: _total(fleet, r) - before[r.name] for r in fleet.replicas}
    gaps = [pcm16_gap(audio[0], x) for x in audio[1:]]
    fleet.cases["saved_voice_across_replicas"] = {"sent": 4, "completed": 4, "failed_explicit": 0, "lost": 0,
                                                  "streams_per_replica": per_replica,
                                                  "max_pcm16_gap": max(gaps)}
    assert all(n >= 1 for n in per_replica.values()), per_replica
    assert max(gaps) <= SAME_PCM16_LSB, gaps


def test_ttfa_through_the_balancer_over_direct(fleet: Fleet) -> None:
    """Time to first audio through haproxy over straight to a replica, one run on the idle fleet,
    alternating (a ratio; the figure goes to the results, nothing is asserted on time)."""
    _wait(lambda: all(active_requests(r.metrics_url) == 0 for r in fleet.replicas), CANCEL_FREES_S, "an idle fleet")
    figures = ttfa_ratio(fleet.replicas[0].grpc_url, fleet.lb.grpc_url, rounds=10, tokens=TOKENS)
    fleet.cases["ttfa_balanced_over_direct"] = figures
    assert figures["ratio"] > 0
