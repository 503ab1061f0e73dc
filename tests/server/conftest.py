"""Every test in this folder talks to a real tritonserver: each is marked ``server``
(``-m "not server"`` still leaves them out, as before the folders existed). ``make unit`` runs
``tests/unit`` only."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.server)
