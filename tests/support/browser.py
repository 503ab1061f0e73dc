"""Headless Chromium for the page tests (Debian's ``chromium`` driven by Playwright): where the
browser is, whether a missing one skips (a developer's machine) or fails (CI, where ``make setup``
installs it), and one page of the gateway with its WebSockets and script errors recorded."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ROOT

CHROMIUM = os.environ.get("CHATTTS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
API_KEY = "page-key-1"


TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def under_ci() -> bool:
    """Whether ``$CI`` holds a true value (case-insensitive ``1``, ``true``, ``yes``, ``on``):
    ``CI=0``, ``CI=false`` or an empty ``CI`` is a developer's machine."""
    return os.environ.get("CI", "").strip().lower() in TRUE_VALUES


def need_browser() -> None:
    """Skip (or, under CI, fail) a test when Chromium or Playwright is missing."""
    problem = None
    if not Path(CHROMIUM).is_file():
        problem = f"{CHROMIUM} not found (Debian package `chromium`: apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "Playwright for Python is not installed (pip install playwright; the browser is Debian's)"
    if problem is None:
        return
    if under_ci():
        pytest.fail(f"{problem}: make setup installs it")
    pytest.skip(problem)


@contextmanager
def launched() -> Iterator[Any]:
    """A headless Chromium that may autoplay audio, closed at the end."""
    need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream"])
        try:
            yield b
        finally:
            b.close()


class Page:
    """One page of the gateway in the browser: its WebSockets, script errors and console errors
    (a failed resource load, such as a missing favicon or a refused request, is one) recorded
    from the first load on."""

    def __init__(self, browser: Any, url: str, key: str | None = API_KEY) -> None:
        self.page = browser.new_page(viewport={"width": 900, "height": 700})
        self.errors: list[str] = []
        self.console_errors: list[str] = []
        self.sockets: list[Any] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda msg: self.console_errors.append(f"{msg.text} ({msg.location.get('url')})")
                     if msg.type == "error" else None)
        self.page.on("websocket", lambda ws: self.sockets.append(ws))
        self.page.goto(url)
        assert self.page.title() == "ChatTTS streaming"
        if key is not None:
            self.page.fill("#key", key)
            self.page.dispatch_event("#key", "change")  # the voices need the key
            self.page.wait_for_function("window.ttsState.voicesLoaded", timeout=20_000)

    def state(self) -> dict[str, Any]:
        return dict(self.page.evaluate("window.ttsState"))

    def wait_state(self, *states: str, timeout_ms: int = 120_000) -> dict[str, Any]:
        self.page.wait_for_function(f"{list(states)}.includes(window.ttsState.state)", timeout=timeout_ms)
        return self.state()

    def status(self) -> str:
        return str(self.page.inner_text("#status"))

    def shot(self, tmp_path: Path, name: str) -> None:
        self.page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        if os.environ.get("CHATTTS_UPDATE_SCREENSHOT"):
            self.page.screenshot(path=str(ROOT / "docs" / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.page.close()
