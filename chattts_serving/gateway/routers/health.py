"""``GET /health`` (readiness), ``GET /health/live`` (liveness) and ``GET /metrics``
(Prometheus); none needs the API key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ... import contract
from ..metrics import CONTENT_TYPE
from ..state import Gateway

router = APIRouter()


@router.get("/health")
async def health(state: Gateway) -> JSONResponse:
    """Readiness: 200 when Triton and its streaming door (``chattts``, which may be unloaded
    while the server stays ready) answer ready within ``health_timeout_s``, else 503; 503
    ``draining`` at once while the gateway drains (a load balancer stops routing to it)."""
    cfg = state.settings
    if state.drain.draining:
        return JSONResponse({"status": "draining", "streams_in_flight": state.streams}, status_code=503,
                            headers={"Retry-After": str(cfg.retry_after_s)})
    ready = await state.client.ready(cfg.health_timeout_s, model=contract.MODEL_STREAM)
    body: dict[str, Any] = {"status": "ok" if ready else "unavailable",
                            "triton": "ready" if ready else "not ready", "triton_url": cfg.triton_url,
                            "streams_in_flight": state.streams}
    if state.watch is not None:
        body["admission"] = state.watch.describe()
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/health/live")
async def health_live() -> dict[str, str]:
    """Liveness: 200 while the process serves requests, whatever Triton's state."""
    return {"status": "ok"}


@router.get("/metrics")
async def prometheus_metrics(state: Gateway) -> Response:
    """The gateway's metrics in Prometheus' text format (:mod:`..metrics`)."""
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
