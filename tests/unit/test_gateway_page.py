"""Whether a missing browser skips the page tests (a developer's machine) or fails them (CI):
only a true ``$CI`` (``1``, ``true``, ``yes``, ``on``, any case) fails (tests/support/browser.py;
the page itself: tests/server/test_gateway_page.py)."""

from __future__ import annotations

import pytest

from tests.support import browser


@pytest.mark.parametrize("value, ci", [(None, False), ("", False), ("0", False), ("false", False), ("no", False),
                                       ("off", False), ("1", True), ("true", True), ("TRUE", True), ("yes", True),
                                       ("on", True)])
def test_only_a_true_ci_variable_turns_a_missing_browser_into_a_failure(monkeypatch: pytest.MonkeyPatch,
                                                                        value: str | None, ci: bool) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert browser.under_ci() is ci
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")  # a host without the browser
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="/nonexistent/chromium"):
        browser.need_browser()
