"""Which profiles a run measures and how: each served on its default path (its degraded mode out
of reach), a profile skipped when its graphs were not exported or when it runs exactly what an
earlier one ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chattts_serving import contract

UNREACHABLE_STREAMS = 10**9
UNREACHABLE_TTFA_S = 1e9
"""Degradation thresholds of the default-path servers: never reached."""


def default_path_profile(profile: Any) -> Any:
    """``profile`` with its degraded mode out of reach (thresholds never met): the server then
    runs every request on the default path (the profile's vocoder, chunks and refine-text)."""
    degrade = profile.degrade.model_copy(update={
        "live_high": UNREACHABLE_STREAMS, "live_low": UNREACHABLE_STREAMS - 1,
        "queued_high": UNREACHABLE_STREAMS, "queued_low": UNREACHABLE_STREAMS - 1,
        "ttfa_p95_high_s": UNREACHABLE_TTFA_S, "ttfa_p95_low_s": UNREACHABLE_TTFA_S})
    return profile.model_copy(update={"degrade": degrade})


def resolved_key(artifacts_dir: Path, profile: Any) -> str:
    """What ``profile`` runs on ``artifacts_dir``: its settings without its name, the engine's
    and the vocoders' precisions and the KV cache's resolved (``auto`` decided), as a
    comparable string."""
    from chattts_serving import contract
    from chattts_serving.runtime import Artifacts, resolve_kv_precision, resolve_precision

    art = Artifacts.load(artifacts_dir)
    data = profile.model_dump(mode="json")
    data.pop("name")
    data["engine"]["precision"] = str(resolve_precision(art, profile.engine.precision))
    data["engine"]["kv_cache"] = str(resolve_kv_precision(art, profile.engine.kv_cache, profile.engine.precision))
    data["vocoder"]["precision"] = {g: str(resolve_precision(art, profile.vocoder.precision, g))
                                    for g in (contract.VOCODER_HIDDEN_GRAPH, contract.VOCODER_CODES_GRAPH)}
    return json.dumps(data, sort_keys=True)


def same_as(artifacts_dir: Path, name: str, earlier: dict[str, str]) -> str | None:
    """The earlier profile (``earlier``: name -> :func:`resolved_key`) that runs exactly what
    profile ``name`` runs on ``artifacts_dir``, or None."""
    from chattts_serving.serving.profile import load_profile

    key = resolved_key(artifacts_dir, load_profile(name))
    return next((other for other, k in earlier.items() if k == key), None)


def missing_graphs(artifacts_dir: Path, profile: Any) -> str | None:
    """Why ``profile`` cannot run on ``artifacts_dir`` (a graph of its precision was not
    exported), or None."""
    from chattts_serving.runtime import Artifacts, graph_path

    art = Artifacts.load(artifacts_dir)
    wanted = [(contract.GPT_GRAPH, profile.engine.precision),
              (contract.VOCODER_HIDDEN_GRAPH, profile.vocoder.precision),
              (contract.VOCODER_CODES_GRAPH, profile.vocoder.precision)]
    for graph, precision in wanted:
        try:
            graph_path(art, graph, str(precision))
        except (FileNotFoundError, ValueError) as exc:
            return str(exc)
    return None
