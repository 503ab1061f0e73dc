"""The page at ``/`` in headless Chromium (Debian's ``chromium`` driven by Playwright): it
loads without a console error (its favicon inline), fills the voice picker from
``/v1/audio/voices`` (at once on a gateway without a key; once the key is typed on one with a
key, saying so until then), plays a synthesis streamed over the WebSocket, and shows the time
to first audio. ``CHATTTS_UPDATE_SCREENSHOT=1`` also saves the
picture in docs/openai-gateway.md (``docs/ws-page.png``).

Without Chromium (or Playwright) the test is skipped, naming what to install; under CI
(``$CI`` true: ``1``, ``true``, ``yes`` or ``on``, as ``.ci/run`` and CI services set it) it
fails instead, since ``make setup`` installs both; ``CI=0`` or ``CI=false`` is not CI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chattts_serving import contract
from chattts_serving.gateway import GatewaySettings
from chattts_serving.gateway.ws import WS_PATH
from tests.support.browser import API_KEY, Page, launched
from tests.support.servers import Server, running_gateway, wait_until


@pytest.fixture(scope="module")
def page_url(triton_server: Server) -> Iterator[str]:
    settings = GatewaySettings(triton_url=triton_server.grpc_url, api_key=API_KEY)
    with running_gateway(settings) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched() as b:
        yield b


@pytest.fixture
def page(browser: Any, page_url: str) -> Iterator[Page]:
    p = Page(browser, page_url + "/?max_new_tokens=40&min_new_tokens=40")
    try:
        yield p
    finally:
        p.close()


def test_the_page_plays_a_stream_and_shows_the_time_to_first_audio(page: Page, tmp_path: Path) -> None:
    """Play: the status goes connecting, waiting for the first audio, playing, and done only
    once the last scheduled buffer has played; the text box has a label."""
    p = page.page
    voices = p.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
    assert "alloy" in voices and "narrator" in voices
    assert p.eval_on_selector("label[for=text]", "l => l.textContent") == "Text to speak"
    p.evaluate("""() => { window.seen = []; new MutationObserver(() => window.seen.push(window.ttsState.state))
                   .observe(document.getElementById('status'), {childList: true, subtree: true,
                                                                 characterData: true}); }""")
    p.select_option("#voice", "nova")
    p.fill("#text", "你好，欢迎使用ChatTTS。Streaming speech, word by word.")
    p.click("#play")
    assert p.is_disabled("#play") and p.is_enabled("#stop")
    state = page.wait_state("done", "error")
    assert state["error"] is None and state["done"] is True and state["state"] == "done", state
    seen = p.evaluate("window.seen")
    seen = seen[seen.index("connecting"):]
    assert list(dict.fromkeys(seen)) == ["connecting", "waiting", "playing", "done"], seen
    assert state["framesReceived"] >= 2 and state["framesScheduled"] == state["framesReceived"]
    assert state["samples"] == 2 * contract.samples_for_tokens(40)  # two sentences of 40 tokens
    assert isinstance(state["ttfaMs"], int) and state["ttfaMs"] > 0
    assert p.inner_text("#ttfa") == f"{state['ttfaMs']} ms"
    assert len(state["sentences"]) == 2 and not page.errors and not page.console_errors, page.console_errors
    assert page.status().startswith("Done: 2 sentences") and p.is_enabled("#play") and p.is_disabled("#stop")
    assert p.input_value("#voice") == "nova"
    page.shot(tmp_path, "ws-page")


def test_play_twice_is_one_stream(page: Page) -> None:
    """Play pressed twice plays one stream, not two over each other (the counter once merged
    them: "24 frames, 22.17 s" for 11.08 s of speech): the button is disabled while playing
    and a click on it then does nothing."""
    page.page.fill("#text", "第一句话。第二句话。")
    page.page.click("#play")
    page.page.click("#play", force=True)  # a second press, on the disabled button
    page.page.evaluate("document.getElementById('play').click()")  # and one the browser lets through
    state = page.wait_state("done", "error")
    assert state["state"] == "done" and state["streams"] == 1 and len(page.sockets) == 1, state
    assert state["samples"] == 2 * contract.samples_for_tokens(40)


def test_stop_closes_the_socket_and_the_playback(browser: Any, page_url: str, tmp_path: Path) -> None:
    """Stop during a long stream: the page closes its WebSocket (the gateway then has no stream
    in flight: its synthesis is cancelled), stops the audio, says "Stopped." and can play again."""
    import httpx2 as httpx

    p = Page(browser, page_url + "/?max_new_tokens=2000&min_new_tokens=2000")
    try:
        p.page.fill("#text", "这是一段很长很长的话，要说很久很久。")
        p.page.click("#play")
        p.wait_state("playing")
        p.page.click("#stop")
        state = p.wait_state("stopped", timeout_ms=10_000)
        assert p.status() == "Stopped." and p.page.is_enabled("#play") and p.page.is_disabled("#stop")
        assert len(p.sockets) == 1 and wait_until(p.sockets[0].is_closed, 10.0)
        assert wait_until(lambda: "tts_gateway_streams_in_flight 0.0" in httpx.get(page_url + "/metrics").text, 30.0)
        assert not state["done"] and state["error"] is None and p.state()["framesReceived"] == state["framesReceived"]
        assert p.page.evaluate("window.ttsState.state") == "stopped"
        p.shot(tmp_path, "ws-page-stopped")
    finally:
        p.close()


def test_a_missing_key_is_an_error_with_a_hint_and_empty_text_a_message(browser: Any, page_url: str,
                                                                       tmp_path: Path) -> None:
    p = Page(browser, page_url + "/?max_new_tokens=40&min_new_tokens=40", key=None)
    try:
        p.page.fill("#text", "   ")
        p.page.click("#play")
        assert p.status() == "Type some text to speak first." and not p.sockets and p.page.is_enabled("#play")
        p.page.fill("#text", "你好。")
        p.page.click("#play")
        state = p.wait_state("error")
        assert state["error"]["code"] == "invalid_api_key"
        assert "API key" in p.status() and p.page.is_enabled("#play") and p.page.is_disabled("#stop")
        p.shot(tmp_path, "ws-page-error")
    finally:
        p.close()


def test_busy_is_an_error_that_says_try_again(browser: Any, triton_server: Server) -> None:
    """A gateway relaying its one stream already: the page's start is refused busy, and the
    page says to try again (not the raw server text)."""
    import json

    import websockets.sync.client as ws_client

    settings = GatewaySettings(triton_url=triton_server.grpc_url, max_streams=1)
    with running_gateway(settings) as url, ws_client.connect(url.replace("http://", "ws://") + WS_PATH) as holder:
        holder.send(json.dumps({"type": "start", "voice": "alloy"}))
        assert json.loads(holder.recv(timeout=60))["type"] == "started"
        p = Page(browser, url, key=None)
        try:
            p.page.fill("#text", "你好。")
            p.page.click("#play")
            state = {**p.wait_state("error"), "status": p.status()}
        finally:
            p.close()
    assert state["error"]["kind"] == "busy" and "busy" in state["status"] and "try again" in state["status"]


def test_an_emoji_is_reported_not_spoken_and_the_stream_ends_done(page: Page, tmp_path: Path) -> None:
    """好的，没问题！😀 plays and ends done, the emoji reported as not spoken (it once ended in a
    red error); an emoji alone at the end is skipped the same way."""
    page.page.fill("#text", "好的，没问题！😀 👍")
    page.page.click("#play")
    state = page.wait_state("done", "error")
    assert state["state"] == "done" and state["error"] is None, state
    assert state["unspoken"] == ["😀", "👍"] and state["samples"] == contract.samples_for_tokens(40)
    assert "not spoken: 😀 👍" in page.status() and not page.page.query_selector_all("#log .error")
    page.shot(tmp_path, "ws-page-emoji")


def test_empty_text_clears_the_last_streams_figures(page: Page) -> None:
    """An "empty text" press after a stream clears its time to first audio, frame count and
    sentences: they would read as this press's."""
    p = page.page
    p.fill("#text", "你好。")
    p.click("#play")
    assert page.wait_state("done", "error")["state"] == "done"
    assert p.inner_text("#ttfa").endswith(" ms") and p.inner_text("#frames") != "0 frames"
    assert p.inner_text("#log")
    p.fill("#text", "  ")
    p.click("#play")
    assert page.status() == "Type some text to speak first."
    assert (p.inner_text("#ttfa"), p.inner_text("#frames"), p.inner_text("#log")) == ("–", "0 frames", "")
    state = page.state()
    assert (state["samples"], state["ttfaMs"], state["sentences"], state["framesReceived"]) == (0, None, [], 0)
    assert not page.errors and not page.console_errors, page.console_errors


def test_without_a_gateway_key_the_voices_load_at_once_and_with_one_the_page_asks_for_it(
        browser: Any, triton_server: Server, page_url: str) -> None:
    """A gateway without a key: the voice picker fills on load, no key typed, no console error.
    A gateway with one: the page asks for the key before asking for the voices (no request bound
    to fail, so no console error), and fills the picker once the key is typed."""
    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url)) as url:
        p = Page(browser, url, key=None)
        try:
            p.page.wait_for_function("window.ttsState.voicesLoaded", timeout=20_000)
            voices = p.page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
            assert "alloy" in voices and p.status() == "Ready."
            assert not p.errors and not p.console_errors, p.console_errors
        finally:
            p.close()
    p = Page(browser, page_url, key=None)
    try:
        p.page.wait_for_function("document.getElementById('status').textContent.includes('API key')")
        assert "needs an API key" in p.status() and not p.page.query_selector_all("#voice option")
        assert not p.console_errors, p.console_errors
        p.page.fill("#key", API_KEY)
        p.page.dispatch_event("#key", "change")
        p.page.wait_for_function("window.ttsState.voicesLoaded", timeout=20_000)
        assert "nova" in p.page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
        assert p.status() == "Ready." and not p.errors and not p.console_errors, p.console_errors
    finally:
        p.close()
