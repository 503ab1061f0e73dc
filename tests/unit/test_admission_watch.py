"""The admission watch's follower without a server: which targets it resolves, and when a door
reads full across several server addresses (every reachable one full, anything unknown not
full); the gateway's own busy decision and its on/off knob. Against a real tritonserver:
tests/server/test_gate.py (the watch model) and tests/server/test_gateway.py (the gateway refusing by it)."""

from __future__ import annotations

import asyncio

import pytest

from chattts_serving import contract
from chattts_serving.client.admission_watch import AdmissionWatch, target_host_port
from chattts_serving.errors import ErrorKind
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.errors import busy_refusal


@pytest.mark.parametrize(("url", "expected"), [
    ("127.0.0.1:8001", ("127.0.0.1", 8001)),
    ("triton:8001", ("triton", 8001)),
    ("dns:///chattts-triton-headless:8001", ("chattts-triton-headless", 8001)),
    ("dns:triton:9000", ("triton", 9000)),
    ("[::1]:8001", ("::1", 8001)),
    ("dns:///[fd00::5]:8001", ("fd00::5", 8001)),
    ("triton", ("triton", 443)),
    ("unix:/run/triton.sock", None),
    ("ipv4:10.0.0.1:8001,10.0.0.2:8001", None),
    ("xds:///triton", None),
    ("triton:port", None),
])
def test_the_target_names_what_to_resolve(url: str, expected: tuple[str, int] | None) -> None:
    assert target_host_port(url) == expected


def _watch(addresses: set[str], full: dict[str, tuple[bool, ...]],
           unreachable: frozenset[str] = frozenset()) -> AdmissionWatch:
    """A follower in the given state (what its subscriptions would have recorded)."""
    watch = AdmissionWatch("dns:///triton:8001")
    watch._addresses = frozenset(addresses)
    watch._full.update(full)
    watch._unreachable.update(unreachable)
    return watch


FULL, FREE = (True, False), (False, False)
"""Reports in the order of contract.ADMISSION_DOORS: chattts full or not, chattts_offline free."""


@pytest.mark.parametrize(("addresses", "reports", "unreachable", "stream_full"), [
    ({"a"}, {"a": FULL}, set(), True),
    ({"a"}, {"a": FREE}, set(), False),
    ({"a", "b"}, {"a": FULL, "b": FULL}, set(), True),
    ({"a", "b"}, {"a": FULL, "b": FREE}, set(), False),  # requests still find room on b
    ({"a", "b"}, {"a": FULL}, set(), False),  # b's state unknown (no subscription yet, or no watch model)
    ({"a", "b"}, {"a": FULL}, {"b"}, True),  # b refuses connections: round robin sends it nothing either
    ({"a"}, {}, {"a"}, False),  # nothing reachable: requests go on and meet Triton's own error
    (set(), {}, set(), False),  # not resolved yet
    ({"a"}, {"a": ()}, set(), False),  # a report without the door
], ids=["one-full", "one-free", "both-full", "one-of-two-free", "one-unknown", "one-unreachable",
        "none-reachable", "unresolved", "short-report"])
def test_a_door_is_full_only_when_every_reachable_address_reports_it_full(
        addresses: set[str], reports: dict[str, tuple[bool, ...]], unreachable: set[str], stream_full: bool) -> None:
    watch = _watch(addresses, reports, frozenset(unreachable))
    assert watch.full(contract.MODEL_STREAM) is stream_full
    assert watch.full(contract.MODEL_OFFLINE) is False
    with pytest.raises(ValueError):
        watch.full("chattts_gpt")  # not a door the watch reports on


def test_a_follower_of_an_address_where_nothing_listens_marks_it_unreachable() -> None:
    async def follow() -> dict[str, object]:
        from tests.support.servers import free_port

        watch = AdmissionWatch(f"127.0.0.1:{free_port()}", retry_s=0.05)
        watch.start()
        try:
            for _ in range(200):
                if watch.describe()["unreachable"]:
                    break
                await asyncio.sleep(0.05)
            return watch.describe()
        finally:
            await watch.close()

    assert asyncio.run(follow()) == {"addresses": 1, "watched": 0, "unreachable": 1,
                                     "full": {contract.MODEL_STREAM: False, contract.MODEL_OFFLINE: False}}


def test_the_gateway_refuses_busy_itself_at_its_limit_or_when_the_server_is_full() -> None:
    assert busy_refusal(0, 1, None) is None
    own = busy_refusal(1, 1, None)
    assert own is not None and (own.status, own.code, own.kind) == (503, "server_busy", ErrorKind.BUSY)
    assert "relays 1 stream already" in own.message
    several = busy_refusal(4, 4, None)
    assert several is not None and "relays 4 streams already" in several.message
    assert busy_refusal(0, 1, _watch({"a"}, {"a": FREE})) is None
    full = busy_refusal(0, 1, _watch({"a"}, {"a": FULL}))
    assert full is not None and (full.status, full.code, full.kind) == (503, "server_busy", ErrorKind.BUSY)
    assert "every stream slot" in full.message


@pytest.mark.parametrize(("text", "value"), [("true", True), ("On", True), ("1", True), ("yes", True),
                                             ("false", False), ("OFF", False), ("0", False), ("no", False)])
def test_the_admission_watch_is_switched_by_flag_or_variable(text: str, value: bool) -> None:
    assert GatewaySettings.from_env({"CHATTTS_GATEWAY_ADMISSION_WATCH": text}).admission_watch is value
    assert GatewaySettings().admission_watch is True


def test_a_malformed_switch_names_its_variable() -> None:
    with pytest.raises(ValueError, match="CHATTTS_GATEWAY_ADMISSION_WATCH"):
        GatewaySettings.from_env({"CHATTTS_GATEWAY_ADMISSION_WATCH": "maybe"})


def test_a_malformed_switch_flag_is_a_usage_error_naming_it() -> None:
    from chattts_serving.gateway.__main__ import main, parse_args, settings_from_args

    assert settings_from_args(parse_args(["--admission-watch", "off"])).admission_watch is False
    with pytest.raises(ValueError, match="--admission-watch 'maybe'"):
        settings_from_args(parse_args(["--admission-watch", "maybe"]))
    assert main(["--admission-watch", "maybe"]) == 2
