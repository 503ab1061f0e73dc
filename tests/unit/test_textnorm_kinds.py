"""The normaliser's shape: a package by kind, each kind's pattern next to its reader, the
scanner's precedence in one list, no module longer than about 400 lines."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from chattts_serving.text import normalize as textnorm
from chattts_serving.text.normalize.kind import Kind
from chattts_serving.text.normalize.precedence import KINDS, PRECEDENCE

PACKAGE = Path(textnorm.__file__).parent
MAX_MODULE_LINES = 400


def test_no_module_of_the_normaliser_is_longer_than_400_lines() -> None:
    long = {p.name: n for p in PACKAGE.glob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


def test_every_kind_defined_in_a_family_module_is_in_the_precedence_list() -> None:
    """A kind written in its module but not listed would never be scanned: adding a kind is
    its module plus one entry in the list."""
    defined = {}
    for info in pkgutil.iter_modules([str(PACKAGE)]):
        module = importlib.import_module(f"{textnorm.__name__}.{info.name}")
        defined.update({id(v): v for v in vars(module).values() if isinstance(v, Kind)})
    assert {k.name for k in defined.values()} == set(KINDS)
    assert len(KINDS) == len(PRECEDENCE), "a kind name is used twice"


def test_each_kinds_groups_are_its_own() -> None:
    """Group names are unique over the scanner (re would refuse duplicates) and none is the
    scanner's own k_<kind> prefix."""
    groups = [g for k in PRECEDENCE for g in re.compile(k.pattern).groupindex]
    assert len(groups) == len(set(groups))
    assert not any(g.startswith("k_") for g in groups)
