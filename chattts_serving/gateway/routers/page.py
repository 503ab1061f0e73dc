"""``GET /``: the demo page (type text, pick a voice, hear it stream over the WebSocket)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ..state import Gateway

router = APIRouter()


def page_html(needs_key: bool = False) -> str:
    """The demo page (``static/index.html``, no build step, no external assets); ``needs_key``:
    whether the gateway has an API key (``<body data-needs-key>``: the page then asks for the
    key before it lists the voices)."""
    html = resources.files("chattts_serving.gateway").joinpath("static/index.html").read_text(encoding="utf-8")
    return html.replace("<body>", f'<body data-needs-key="{str(needs_key).lower()}">', 1)


@router.get("/", include_in_schema=False)
async def page(state: Gateway) -> HTMLResponse:
    """The demo page: type text, pick a voice, hear it stream (``gateway/static/index.html``)."""
    return HTMLResponse(page_html(state.settings.api_key is not None), headers={"Cache-Control": "no-store"})
