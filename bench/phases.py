"""The server phases of a run: one adapter per phase between the run's :class:`~bench.config.Config`
and the module that measures it (closed-loop levels, open loop, doors, gateway, WebSocket,
segmentation modes, overload burst), in the order of :data:`SERVER_PHASES`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Config
from .gatewayload import gateway_process
from .server import free_port

SMOKE_HOLD_WAIT_S = 10.0
"""How long a smoke run's saturated burst waits for its holds to take every slot (a full run
waits up to ``run_burst``'s default)."""
BURST_TOKENS = 16
"""Token budget of each burst request."""


@dataclass
class PhaseContext:
    """What a server phase gets: the run's :class:`Config`, the running server
    (:class:`~bench.serverload.ServerSession`), the profile's result so far
    (``prof``: earlier phases' keys, e.g. ``levels``) and whether this is the default profile."""

    cfg: Config
    session: Any
    prof: dict[str, Any]
    is_default: bool


@dataclass(frozen=True)
class ServerPhase:
    """One part of the benchmark run against a running default-path server: ``run(ctx)``
    returns what is stored under ``key`` in the profile's result (and, for the default profile,
    at the top level of bench.json); ``default_only``: run for the default profile only.
    Figures derived from it belong in :func:`~bench.figures.profile_figures`,
    its Markdown in :data:`~bench.report.SECTIONS`."""

    key: str
    run: Callable[[PhaseContext], Any]
    default_only: bool = False


def _levels_phase(ctx: PhaseContext) -> Any:
    from .serverload import run_levels

    return run_levels(ctx.session, levels=ctx.cfg.levels, requests_for=ctx.cfg.requests_for, tokens=ctx.cfg.tokens)


def _open_loop_phase(ctx: PhaseContext) -> Any:
    from .openloop import measure_open_loop

    levels = [lv for lv in ctx.prof.get("levels", []) if lv.get("tokens_per_s")]
    capacity = max(levels, key=lambda lv: lv["concurrency"])["tokens_per_s"] if levels else None
    return measure_open_loop(ctx.session, requests=ctx.cfg.open_loop_requests, tokens=ctx.cfg.tokens,
                             capacity_tokens_per_s=capacity)


def _burst_phase(ctx: PhaseContext) -> Any:
    import asyncio

    from .burst import CLIENT_NICE, run_burst
    from .serverload import wait_idle

    s, cfg = ctx.session, ctx.cfg
    if cfg.burst_clients <= 0:
        return {"skipped": "--burst-clients 0"}
    out: dict[str, Any] = {}
    entry = s.profile.entry
    hold, offline_hold = entry.max_concurrent_streams, entry.offline_threads
    # Saturated: every stream slot and every chattts_offline slot held; bursts to chattts, then to
    # chattts_offline, then through the gateway (unless --skip-gateway); the client receives only
    # refusals and runs at CLIENT_NICE where allowed (see run_burst).
    doors = ("stream", "offline") + (("gateway",) if cfg.gateway_levels else ())
    saturated = {"hold": hold, "hold_tokens": cfg.hold_tokens, "client_nice": CLIENT_NICE,
                 "offline_hold": offline_hold, "doors": doors}
    if cfg.smoke:  # the small model's holds end too soon to be all held at once: do not wait long
        saturated["hold_wait_s"] = SMOKE_HOLD_WAIT_S
    for name, kwargs in (("burst", {}), ("saturated", saturated)):
        s.progress(f"server burst ({name}): {cfg.burst_rounds} x {cfg.burst_clients} clients, "
                   f"{BURST_TOKENS} tokens each"
                   + (f", after {hold} streams of {cfg.hold_tokens} tokens and {offline_hold} offline requests hold "
                      f"every slot; to {', '.join(doors)}" if kwargs else ""))
        with contextlib.ExitStack() as stack:
            if "gateway" in kwargs.get("doors", ()):
                gw_url, _ = stack.enter_context(gateway_process(s.grpc_url, free_port(),
                                                                cfg.out / "bench_burst_gateway.log"))
                kwargs = {**kwargs, "gateway_url": gw_url}
            window = s.monitor.begin()
            summary = asyncio.run(run_burst(s.grpc_url, cfg.burst_clients, BURST_TOKENS, timeout_s=s.timeout_s,
                                            metrics_url=s.metrics_url, rounds=cfg.burst_rounds, **kwargs))
            usage = s.monitor.end(window)
        out[name] = {**summary, "other_cpu_percent": usage["other_cpu_percent"], "cpu_percent": usage["cpu_percent"]}
        s.progress(f"server burst ({name}): {summary['outcomes']}, busy p99 {summary['busy_p99_s']} s"
                   + "".join(f"; {d}: {summary[d]['outcomes']}, busy p99 {summary[d]['busy_p99_s']} s"
                             for d in kwargs.get("doors", ())[1:]))
        out[name]["idle_after_s"] = wait_idle(s.metrics_url)
    return out


def _gateway_phase(ctx: PhaseContext) -> Any:
    from .gatewayload import run_gateway_overhead

    s, cfg = ctx.session, ctx.cfg
    if not cfg.gateway_levels:
        return {"skipped": "--skip-gateway", "levels": []}
    s.progress(f"gateway: /v1/audio/speech against direct gRPC, levels {list(cfg.gateway_levels)}")
    return run_gateway_overhead(s.grpc_url, s.sentences, levels=cfg.gateway_levels,
                                requests_for=(lambda c: c) if cfg.smoke else cfg.requests_for, tokens=cfg.tokens,
                                voice=str(cfg.voice_seed), port=free_port(), log_path=cfg.out / "bench_gateway.log",
                                progress=s.progress)


def _ws_phase(ctx: PhaseContext) -> Any:
    from .wsload import WS_LEVELS, run_ws_phase

    s, cfg = ctx.session, ctx.cfg
    if not cfg.gateway_levels:
        return {"skipped": "--skip-gateway", "levels": []}
    s.progress(f"websocket: text at LLM speed through /v1/audio/speech/stream, levels {list(WS_LEVELS)}")
    return run_ws_phase(s.grpc_url, s.sentences, tokens=cfg.tokens, voice=str(cfg.voice_seed), port=free_port(),
                        log_path=cfg.out / "bench_ws.log", sentences_per_text=2 if cfg.smoke else 3,
                        progress=s.progress)


def _doors_phase(ctx: PhaseContext) -> Any:
    from .doors import LEVELS, run_doors

    s, cfg = ctx.session, ctx.cfg
    s.progress(f"doors: chattts (BLS) and chattts_ensemble taking turns, levels {list(LEVELS)}")
    from .figures import OUTSIDE_LOAD_WARN_PERCENT

    return run_doors(s, tokens=cfg.tokens, requests_for=cfg.requests_for, pipeline=ctx.prof.get("pipeline"),
                     outside_load_percent=OUTSIDE_LOAD_WARN_PERCENT)


def _modes_phase(ctx: PhaseContext) -> Any:
    from .modes import measure_modes

    s = ctx.session
    return measure_modes(s.grpc_url, s.sentences, tokens=ctx.cfg.tokens, requests=1 if ctx.cfg.smoke else 4,
                         voice=s.voice, timeout_s=s.timeout_s, progress=s.progress)


SERVER_PHASES: list[ServerPhase] = [
    ServerPhase("levels", _levels_phase),
    ServerPhase("open_loop", _open_loop_phase),
    ServerPhase("doors", _doors_phase, default_only=True),
    ServerPhase("gateway", _gateway_phase, default_only=True),
    ServerPhase("ws", _ws_phase, default_only=True),
    ServerPhase("modes", _modes_phase, default_only=True),
    ServerPhase("burst", _burst_phase, default_only=True),
]
"""The server phases, in order, on one default-path server per profile. ``levels`` comes first
(the open loop aims at its capacity); the burst last (it saturates the server, then waits until
it is idle again). A new phase appends itself here and writes only its own key."""
