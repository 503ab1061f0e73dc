"""The page at ``/`` in headless Chromium (Debian's ``chromium`` driven by Playwright): it
loads, fills the voice picker from ``/v1/audio/voices``, plays a synthesis streamed over the
WebSocket, and shows the time to first audio. ``CHATTTS_UPDATE_SCREENSHOT=1`` also saves the
README's picture (``docs/ws-page.png``).

Without Chromium (or Playwright) the test is skipped, naming what to install; under CI
(``$CI`` true: ``1``, ``true``, ``yes`` or ``on``, as ``.ci/run`` and CI services set it) it
fails instead, since ``make setup`` installs both; ``CI=0`` or ``CI=false`` is not CI."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Server, running_gateway

from chattts_serving import contract
from chattts_serving.gateway import GatewaySettings

CHROMIUM = os.environ.get("CHATTTS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOT = ROOT / "docs" / "ws-page.png"
API_KEY = "page-key-1"


TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def under_ci() -> bool:
    """Whether ``$CI`` holds a true value (case-insensitive ``1``, ``true``, ``yes``, ``on``):
    ``CI=0``, ``CI=false`` or an empty ``CI`` is a developer's machine."""
    return os.environ.get("CI", "").strip().lower() in TRUE_VALUES


@pytest.mark.parametrize("value, ci", [(None, False), ("", False), ("0", False), ("false", False), ("no", False),
                                       ("off", False), ("1", True), ("true", True), ("TRUE", True), ("yes", True),
                                       ("on", True)])
def test_only_a_true_ci_variable_turns_a_missing_browser_into_a_failure(monkeypatch: pytest.MonkeyPatch,
                                                                        value: str | None, ci: bool) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert under_ci() is ci
    monkeypatch.setitem(globals(), "CHROMIUM", "/nonexistent/chromium")  # a host without the browser
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="/nonexistent/chromium"):
        _need_browser()


def _need_browser() -> None:
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


@pytest.fixture(scope="module")
def page_url(triton_server: Server) -> Iterator[str]:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY)
    with running_gateway(settings) as url:
        yield url


@pytest.mark.server
def test_the_page_plays_a_stream_and_shows_the_time_to_first_audio(page_url: str, tmp_path: Path) -> None:
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream"])
        try:
            page = browser.new_page(viewport={"width": 900, "height": 640})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(page_url + "/?max_new_tokens=40&min_new_tokens=40")
            assert page.title() == "ChatTTS streaming"
            page.fill("#key", API_KEY)
            page.dispatch_event("#key", "change")  # the voices need the key
            page.wait_for_function("window.ttsState.voicesLoaded", timeout=20_000)
            voices = page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
            assert "alloy" in voices and "narrator" in voices
            page.select_option("#voice", "nova")
            page.fill("#text", "你好，欢迎使用ChatTTS。Streaming speech, word by word.")
            page.click("#play")
            page.wait_for_function("window.ttsState.done || window.ttsState.error", timeout=120_000)
            state = page.evaluate("window.ttsState")
            assert state["error"] is None and state["done"] is True, state
            assert state["framesReceived"] >= 2 and state["framesScheduled"] == state["framesReceived"]
            assert state["samples"] == 2 * contract.samples_for_tokens(40)  # two sentences of 40 tokens
            assert isinstance(state["ttfaMs"], int) and state["ttfaMs"] > 0
            assert page.inner_text("#ttfa") == f"{state['ttfaMs']} ms"
            assert len(state["sentences"]) == 2 and not errors
            assert page.input_value("#voice") == "nova"
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            if os.environ.get("CHATTTS_UPDATE_SCREENSHOT"):
                page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
