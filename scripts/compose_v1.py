"""Copies of Compose v2 files that Docker Compose 1.29 (Debian bookworm's ``docker-compose``)
accepts, for hosts where no Compose v2 can be installed (Debian bookworm has none).

1.29 lacks three features our files use:

- the top-level ``name``: dropped (pass ``-p chattts``);
- ``depends_on.<service>.required``: dropped (1.29 has no optional dependencies; a dependency
  on a service whose profile is inactive is then not waited for, which is what
  ``required: false`` means);
- the ``!reset`` and ``!override`` tags of an override file (Compose v2.24+), which remove or
  replace a value of the files before it instead of merging into it (compose.cpu.yaml resets
  the GPU reservation; a list such as ``ports`` is otherwise merged): the value is removed from
  the earlier files' copies, and the override's copy keeps no key (``!reset``) or the plain
  value (``!override``).

Everything else is kept as it is::

    python3 scripts/compose_v1.py --out /tmp/v1 docker/compose.yaml docker/compose.cpu.yaml
    docker-compose --project-directory docker -p chattts \\
        -f /tmp/v1/compose.yaml -f /tmp/v1/compose.cpu.yaml ...

``--project-directory docker`` keeps the files' relative paths (build contexts, bind mounts)
relative to docker/, where the originals lie.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml


class Reset:
    """A value tagged ``!reset`` in an override file."""


class Override:
    """A value tagged ``!override`` in an override file."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _Loader(yaml.SafeLoader):
    """YAML with Compose's ``!reset`` and ``!override`` tags."""


def _override(loader: yaml.SafeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    return Override(loader.construct_scalar(node))  # type: ignore[arg-type]


_Loader.add_constructor("!reset", lambda loader, node: Reset())
_Loader.add_constructor("!override", _override)


def load(path: Path) -> dict[str, Any]:
    """One compose file, ``!reset`` / ``!override`` values as :class:`Reset` / :class:`Override`."""
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # a SafeLoader with two tags
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a compose file (no mapping at the top)")
    return data


def _apply_resets(override: dict[str, Any], earlier: list[dict[str, Any]]) -> None:
    """Remove each ``!reset`` or ``!override`` key of ``override`` from the same place in
    ``earlier``; in ``override`` drop it (``!reset``) or keep its plain value (``!override``)."""
    for key, value in list(override.items()):
        if isinstance(value, (Reset, Override)):
            if isinstance(value, Reset):
                del override[key]
            else:
                override[key] = value.value
            for doc in earlier:
                doc.pop(key, None)
        elif isinstance(value, dict):
            _apply_resets(value, [d[key] for d in earlier if isinstance(d.get(key), dict)])


def _drop_v2_only(compose: dict[str, Any]) -> None:
    compose.pop("name", None)
    for service in (compose.get("services") or {}).values():
        depends = service.get("depends_on") if isinstance(service, dict) else None
        if isinstance(depends, dict):
            for cond in depends.values():
                if isinstance(cond, dict):
                    cond.pop("required", None)


def to_v1(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of compose ``files`` (in ``-f`` order) that 1.29 accepts; the inputs are unchanged."""
    out = [copy.deepcopy(f) for f in files]
    for i in range(1, len(out)):
        _apply_resets(out[i], out[:i])
    for doc in out:
        _drop_v2_only(doc)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the copies (same file names)")
    parser.add_argument("files", type=Path, nargs="+", help="compose files in -f order")
    args = parser.parse_args(argv)
    names = [f.name for f in args.files]
    if len(set(names)) != len(names):
        parser.error("the files need distinct names")
    try:
        docs = to_v1([load(f) for f in args.files])
    except (OSError, yaml.YAMLError, ValueError) as exc:
        print(f"compose_v1: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, doc in zip(names, docs, strict=True):
        (args.out / name).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
