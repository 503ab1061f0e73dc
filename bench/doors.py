"""The two streaming doors side by side on one server: ``chattts`` (the C++ gate in front of the
Python BLS entry model) and ``chattts_ensemble`` (Triton's ensemble: front end -> GPT engine in
ensemble mode -> the ensemble's vocoder step).

The same jobs at closed-loop concurrency 1 and 16, the doors taking turns at each level (BLS,
then ensemble), each phase measured like the benchmark's levels (:meth:`ServerSession.measure`:
TTFA, generated tokens per second, the server tree's CPU seconds per process). Figures
(:data:`DOOR_FIGURES`): TTFA p50 at c=1 of each door and their ratio; generated tokens per
second at c=16 over the minimal in-process pipeline's (pipeline efficiency) for each door; the
server's CPU milliseconds per generated token at c=16 for each door. Every job's text is one
sentence segment (what the ensemble door serves).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from chattts_serving import contract

from .serverload import Job, ServerSession, level_jobs, run_closed_loop, stream_request
from .stats import RequestRecord, fmt, phase_section, ratio

DOORS: Final = (contract.MODEL_STREAM, contract.MODEL_ENSEMBLE)
"""The doors compared, in the order they take turns."""
LEVELS: Final = (1, 16)
DOOR_FIGURES: Final = ("door_ttfa_p50_s_c1_bls", "door_ttfa_p50_s_c1_ensemble", "ensemble_ttfa_ratio_c1",
                       "door_pipeline_efficiency_c16_bls", "door_pipeline_efficiency_c16_ensemble",
                       "door_cpu_ms_per_token_c16_bls", "door_cpu_ms_per_token_c16_ensemble",
                       "ensemble_throughput_ratio_c16")
"""bench.json figures of this phase (``bls``: ``chattts``; ``ensemble``: ``chattts_ensemble``);
the ratios are ensemble over BLS."""
_SHORT: Final = {contract.MODEL_STREAM: "bls", contract.MODEL_ENSEMBLE: "ensemble"}


def _send(model: str) -> Callable[[str, Job, str, float, float], RequestRecord]:
    def send(url: str, job: Job, voice: str, t0: float, timeout_s: float) -> RequestRecord:
        return stream_request(url, job, voice, t0, timeout_s, model=model)
    return send


def _phase(session: ServerSession, jobs: Sequence[Job], c: int,
           door: str) -> Callable[[], tuple[list[RequestRecord], float]]:
    return lambda: run_closed_loop(session.grpc_url, jobs, c, voice=session.voice, timeout_s=session.timeout_s,
                                   send=_send(door))


def cpu_ms_per_token(level: Mapping[str, Any]) -> float | None:
    """The server tree's CPU milliseconds per generated token of a measured level."""
    tokens = sum(r.get("tokens") or 0 for r in level.get("records", []) if not r.get("error"))
    cpu = level.get("cpu_s")
    return 1000.0 * cpu / tokens if tokens and cpu is not None else None


def run_doors(session: ServerSession, *, tokens: int, requests_for: Callable[[int], int],
              pipeline: Mapping[str, Any] | None, outside_load_percent: float, levels: Sequence[int] = LEVELS,
              doors: Sequence[str] = DOORS) -> dict[str, Any]:
    """Each level of ``levels``, each door of ``doors`` in turn, the same ``requests_for(c)``
    jobs of ``tokens`` tokens; ``pipeline``: the minimal pipeline's result (its tokens_per_s
    and other_cpu_percent). Returns {"levels": [{door, concurrency, cpu_ms_per_token,
    pipeline_efficiency, ...measure keys}], "pipeline_tokens_per_s"}. A row's pipeline
    efficiency is None, with ``pipeline_efficiency_null`` saying why, when it or the pipeline
    ran while other processes used more than ``outside_load_percent`` of a core (the report's
    ``OUTSIDE_LOAD_WARN_PERCENT``)."""
    pipeline = pipeline or {}
    pipe_tps, pipe_other = pipeline.get("tokens_per_s"), pipeline.get("other_cpu_percent") or 0.0
    out: list[dict[str, Any]] = []
    for c in levels:
        jobs = level_jobs(session.sentences, c, requests_for(c), tokens)
        for door in doors:
            m = session.measure(_phase(session, jobs, c, door))
            tokens_per_s, other = m.get("tokens_per_s"), m.get("other_cpu_percent") or 0.0
            skew = [f"{name}: other processes used {load:.0f} % of a core" for name, load in
                    (("this phase", other), ("the minimal pipeline", pipe_other))
                    if isinstance(load, float) and load > outside_load_percent]
            row = {"door": door, "concurrency": c, **m, "cpu_ms_per_token": cpu_ms_per_token(m),
                   "pipeline_efficiency": None if skew else ratio(
                       tokens_per_s if isinstance(tokens_per_s, float) else None, pipe_tps)}
            if skew:
                row["pipeline_efficiency_null"] = "; ".join(skew)
            session.progress(f"doors c={c} {door}: {row['ok']}/{len(jobs)} ok, TTFA p50 {fmt(row['ttfa_p50_s'])} s, "
                             f"{fmt(row['tokens_per_s'])} tokens/s, {fmt(row['cpu_ms_per_token'])} CPU-ms/token")
            out.append(row)
    return {"levels": out, "pipeline_tokens_per_s": pipe_tps}


def _row(result: Mapping[str, Any] | None, door: str, c: int) -> Mapping[str, Any]:
    for row in (result or {}).get("levels", []):
        if row["door"] == door and row["concurrency"] == c:
            return row  # type: ignore[no-any-return]
    return {}


def door_figures(result: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The :data:`DOOR_FIGURES` of a :func:`run_doors` result (None where a row is missing)."""
    f: dict[str, float | None] = {}
    for door, short in _SHORT.items():
        f[f"door_ttfa_p50_s_c1_{short}"] = _row(result, door, 1).get("ttfa_p50_s")
        f[f"door_pipeline_efficiency_c16_{short}"] = _row(result, door, 16).get("pipeline_efficiency")
        f[f"door_cpu_ms_per_token_c16_{short}"] = _row(result, door, 16).get("cpu_ms_per_token")
    f["ensemble_ttfa_ratio_c1"] = ratio(f["door_ttfa_p50_s_c1_ensemble"], f["door_ttfa_p50_s_c1_bls"])
    f["ensemble_throughput_ratio_c16"] = ratio(_row(result, contract.MODEL_ENSEMBLE, 16).get("tokens_per_s"),
                                               _row(result, contract.MODEL_STREAM, 16).get("tokens_per_s"))
    return f


def doors_markdown(result: Mapping[str, Any]) -> list[str]:
    """The report's section comparing the doors (empty when the phase did not run)."""
    doors, lines = phase_section(result, "doors", "The two streaming doors: `chattts` (BLS) and `chattts_ensemble`")
    if doors is None:
        return lines
    lines += ["The same jobs at each level, the doors taking turns on one server (default path). Pipeline "
              f"efficiency: generated tokens/s over the minimal in-process pipeline's "
              f"({fmt(doors.get('pipeline_tokens_per_s'))} tokens/s). CPU: the server's process tree, per generated "
              "token.", "",
              "| door | c | ok | TTFA p50 s | TTFA p95 s | latency p50 s | tokens/s | audio s/s | pipeline efficiency "
              "| CPU-ms/token | CPU s by process (top 4) | other CPU % |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in doors["levels"]:
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(row.get("cpu_s_by_process", {}).items())[:4])
        lines.append(f"| `{row['door']}` | {row['concurrency']} | {row['ok']}/{row['requests']} | "
                     f"{fmt(row['ttfa_p50_s'])} | {fmt(row['ttfa_p95_s'])} | {fmt(row['latency_p50_s'])} | "
                     f"{fmt(row['tokens_per_s'])} | {fmt(row['audio_s_per_s'])} | {fmt(row['pipeline_efficiency'])} | "
                     f"{fmt(row['cpu_ms_per_token'])} | {top} | {fmt(row.get('other_cpu_percent'), 0)} |")
    nulls = sorted({row["pipeline_efficiency_null"] for row in doors["levels"] if row.get("pipeline_efficiency_null")})
    if nulls:
        lines += ["", "Pipeline efficiency not given (outside load): " + "; ".join(nulls) + "."]
    errors = sorted({e for row in doors["levels"] for e in row.get("errors", [])})
    if errors:
        lines += ["", "Errors: " + "; ".join(errors[:5])]
    return lines
