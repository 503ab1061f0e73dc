"""The benchmark and load-test harnesses keep working (small config, seconds; no speed asserted).

- ``python -m chattts_serving.bench --smoke`` runs every part (front end, the three upstream
  baselines, raw step and minimal pipeline, a real default-path server at three closed-loop
  levels, open-loop arrivals, the OpenAI gateway against direct gRPC at 1 and 16, the overload
  burst, the as-deployed row) and writes the JSON, the
  Markdown report and the plots; every request's ``info`` is recorded and every headline figure
  is either a number or null with its reason. The smoke runs both precisions: the ``cpu``
  (fp32) profile and ``cpu-int8`` over the same small artifacts with their int8 GPT graph.
- ``loadtest/run.sh`` drives Locust headless against the session's test server and every user
  type completes requests without a failure.
- The benchmark's pure helpers (percentiles, capacity, figures, outcomes, Prometheus diffs,
  the soak's accounting) compute what they say.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_serving import contract
from chattts_serving.bench import load_sentences
from chattts_serving.bench.burst import CLIENT_NICE
from chattts_serving.bench.doors import DOOR_FIGURES, DOORS
from chattts_serving.bench.gatewayload import FIRST_BYTE_FIGURES, GATEWAY_FIGURES, first_byte_figures, gateway_figures
from chattts_serving.bench.modes import MODE_KEYS
from chattts_serving.bench.openloop import BUDGET_SCALES, open_loop_plan
from chattts_serving.bench.outcomes import Outcome, classify_error, count_outcomes
from chattts_serving.bench.report import (
    FIGURES,
    OUTSIDE_LOAD_WARN_PERCENT,
    frontend_figures,
    profile_figures,
    realtime_streams,
    target_met,
)
from chattts_serving.bench.run import UNREACHABLE_STREAMS, default_path_profile
from chattts_serving.bench.stats import (
    RequestRecord,
    diff_samples,
    engine_batches,
    model_stats,
    needed_buffer_s,
    parse_prometheus,
    realtime_summary,
    summarize,
)
from chattts_serving.bench.wsload import WS_FIGURES, last_deltas, tokens_of
from chattts_serving.client.common import TIMEOUT, ClientError
from chattts_serving.errors import ErrorKind, encode
from chattts_serving.serving.profile import load_profile
from tests.support.servers import running_gateway

ROOT = Path(__file__).resolve().parent.parent

LEVEL_KEYS = {"concurrency", "requests", "ok", "failed", "wall_s", "ttfa_p50_s", "ttfa_p95_s", "latency_p50_s",
              "latency_p95_s", "latency_p99_s", "requests_per_s", "audio_s_per_s", "rtf_mean", "rtf_p50",
              "engine_tokens_per_s", "tokens_per_s", "tokens_requested_per_s", "engine", "models", "cpu_percent",
              "cpu_s_by_process", "rss_mb", "rss_mb_peak", "records", "outcomes", "degraded_requests", "vocoders",
              "realtime_fraction", "start_buffer_p95_s", "other_cpu_percent"}
PROFILE_KEYS = {"throughput_ratio_c16", "ttfa_ratio_c1", "p95_over_p50_c16", "pipeline_efficiency_c16",
                "realtime_streams", "rtf_c1", "gpt_step_ms", "gpt_step_ms_b1", "gpt_step_ms_b4", "gpt_step_ms_b16",
                "gpt_floor_ms_b1", "gpt_floor_ms_b4", "gpt_floor_ms_b16", "step_over_floor_b1", "step_over_floor_b4",
                "floor", "vocoder_cpu_ms_per_token", "vocoder_cpu_ms_per_token_c1"}
"""Issue #13: the figures every benchmarked profile reports."""
TOP_KEYS = {"config", "machine", "baseline", "raw_step", "pipeline", "floor", "levels", "open_loop", "burst",
            "as_deployed", "profiles", "definitions", "null_reasons", "degradation", "started_at", "elapsed_s",
            "frontend", "frontend_p99_ms", "frontend_share_of_ttfa_c1", "gateway", "modes", "ws", "doors", *FIGURES,
            *GATEWAY_FIGURES, *FIRST_BYTE_FIGURES, *DOOR_FIGURES, *MODE_KEYS.values(), *WS_FIGURES}
LOCUST_TYPES = {"grpc:ttfa", "grpc:total", "sse:ttfa", "sse:total", "http:infer", "gateway:ttfa", "gateway:total"}


@pytest.mark.server
@pytest.mark.timeout(900)
def test_bench_smoke_writes_report(small_weights: Path, small_int8_artifacts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "chattts_serving.bench", "--smoke", "--artifacts", str(small_int8_artifacts.root),
         "--weights", str(small_weights), "--profiles", "cpu,cpu-int8", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert result.keys() >= TOP_KEYS, TOP_KEYS - result.keys()
    assert result["config"]["tokens"] == 16 and result["config"]["profiles"] == ["cpu", "cpu-int8"]
    assert result["degradation"] == "off for default-path levels"

    # every level ran its requests on the default path and counted the tokens the server generated
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2, 16]
    for lv in result["levels"]:
        assert lv.keys() >= LEVEL_KEYS, LEVEL_KEYS - lv.keys()
        assert lv["ok"] == lv["requests"] == max(2, lv["concurrency"]), lv["errors"]
        assert lv["degraded_requests"] == 0 and lv["vocoders"] == {"hidden": lv["requests"]}
        assert lv["outcomes"] == {"completed": lv["requests"]}
        for r in lv["records"]:
            assert r["degraded"] is False and r["tokens"] == r["tokens_requested"] == 16
            assert len(r["chunk_times_s"]) == len(r["chunk_samples"]) == r["chunks"] > 0
            assert r["chunk_times_s"][0] == r["ttfa_s"] and sum(r["chunk_samples"]) == round(r["audio_s"] * 24000)
        assert lv["tokens_per_s"] == pytest.approx(16 * lv["ok"] / lv["wall_s"])
        assert 0.0 <= lv["realtime_fraction"] <= 1.0 and lv["start_buffer_p95_s"] >= 0.0

    ol = result["open_loop"]
    assert ol["requests"] == 6 and ol["ok"] == 6 and ol["degraded_requests"] == 0
    assert set(ol["budgets"]) <= {round(s * 16) for s in BUDGET_SCALES}
    assert sorted(r["tokens"] for r in ol["records"]) == sorted(r["tokens_requested"] for r in ol["records"])

    base = result["baseline"]
    assert base["offline"]["ok"] == 2 and base["batched"]["texts"] == 4 and base["batched"]["audio_s_per_s"] > 0
    assert [s["stream_batch_tokens"] for s in base["stream_settings"]] == [24, 8, 4]
    assert all(s["first_chunk_p50_s"] is not None for s in base["stream_settings"])
    assert base["stream"] == base["stream_settings"][0]

    assert set(result["raw_step"]["batches"]) == {"1", "4", "16"} and result["raw_step"]["rounds"] == 3
    assert result["raw_step"]["past_tokens"] == 300
    assert result["floor"]["bandwidth_gbps"] > 0 and result["floor"]["matrix_bytes"] >= 64 << 20
    pipe = result["pipeline"]
    assert pipe["batch"] == 16 and len(pipe["runs"]) == 3 and all(r["tokens"] == 16 * 16 for r in pipe["runs"])

    for key in ("burst", "saturated"):
        b = result["burst"][key]
        assert b["rounds"] == 2 and len(b["round_busy_p99_s"]) == 2, b  # the rounds pooled
        assert sum(b["outcomes"].values()) == b["requests"] == 2 * 16 and b["lost"] == 0, b
    sat = result["burst"]["saturated"]
    assert sat["hold"] == load_profile("cpu").entry.max_concurrent_streams and sat["hold_ready"] is True
    assert sat["outcomes"] == {"busy": 32}, sat  # every slot held: each burst request refused
    entry = load_profile("cpu").entry
    assert sat["offline_hold"] == entry.offline_threads
    for door in ("offline", "gateway"):  # the same bursts to chattts_offline, then through the gateway
        d = sat[door]
        assert d["rounds"] == 2 and len(d["round_busy_p99_s"]) == 2, d
        assert d["requests"] == 2 * 16 and d["lost"] == 0 and d["outcomes"] == {"busy": 32}, d
        assert d["busy_p99_s"] is not None
    assert sat["gateway"]["busy_with_retry_after"] == 32  # every 503 says when to come back
    assert all(v is not None for v in sat["round_busy_p99_s"])
    assert sat["busy_p99_s_from_start"] is not None and sat["busy_before_first_accepted_end"] is None  # none accepted
    # the saturated bursts ran the client at CLIENT_NICE where allowed (root), the idle ones at its own niceness
    want = CLIENT_NICE if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0)
    assert sat["client_nice"] == want and result["burst"]["burst"]["client_nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert result["as_deployed"]["concurrency"] == 16 and result["as_deployed"]["ok"] == 16

    # every figure is a number or null with its reason, the same at the top and in profiles.cpu;
    # the int8 profile ran its own server over the int8 GPT graph and has the same figures
    prof = result["profiles"]["cpu"]
    assert prof.keys() >= PROFILE_KEYS
    int8 = result["profiles"]["cpu-int8"]
    assert "skipped" not in int8 and int8.keys() >= PROFILE_KEYS, int8.get("skipped")
    assert [lv["concurrency"] for lv in int8["levels"]] == [1, 2, 16]
    assert all(lv["ok"] == lv["requests"] and lv["degraded_requests"] == 0 for lv in int8["levels"])
    for p in (prof, int8):  # the floor of each profile's own graph, over the bandwidth of this run
        fl = p["floor"]
        assert fl["bandwidth_gbps"] == result["floor"]["bandwidth_gbps"] and fl["past_tokens"] == 300
        assert 0 < fl["floor_ms"]["1"] < fl["floor_ms"]["4"] < fl["floor_ms"]["16"]
        assert p["gpt_step_ms"] == {b: p[f"gpt_step_ms_b{b}"] for b in ("1", "4", "16")}
        for b in ("1", "4"):
            want = p[f"gpt_step_ms_b{b}"] / fl["floor_ms"][b] if p[f"gpt_step_ms_b{b}"] is not None else None
            assert p[f"step_over_floor_b{b}"] == (pytest.approx(want) if want is not None else None)
    for p in (prof, int8):  # the vocoder's CPU per generated token, from its own process
        for name, c in (("vocoder_cpu_ms_per_token", 16), ("vocoder_cpu_ms_per_token_c1", 1)):
            lv = next(x for x in p["levels"] if x["concurrency"] == c)
            assert "chattts_vocoder" in lv["cpu_s_by_process"], lv["cpu_s_by_process"]  # its own process, counted
            assert p[name] is not None or name in p["null_reasons"], name
            if p[name] is not None:  # (a tiny smoke level may stay below the CPU clock's 10 ms tick: 0.0)
                vocoders = sum(v for k, v in lv["cpu_s_by_process"].items() if "vocoder" in k)
                assert p[name] == pytest.approx(1000 * vocoders / (lv["tokens_per_s"] * lv["wall_s"]), rel=1e-6)
    assert int8["floor"]["graph"] == "gpt_step.int8.onnx" and prof["floor"]["graph"] == "gpt_step.onnx"
    assert int8["floor"]["weight_bytes"] < 0.6 * prof["floor"]["weight_bytes"]  # 8-bit weights (the small
    # config's fp32 code heads, 256 x 2504, are a fifth of its projections' bytes)
    assert set(result["definitions"]) == set(FIGURES)
    for name in FIGURES:
        assert result[name] == prof[name], name
        assert result[name] is not None or name in result["null_reasons"], name
    assert result["realtime_streams"] in (None, 0, 1, 2, 16)
    assert result["ttfa_ratio_c1"] is not None or "outside load" in result["null_reasons"]["ttfa_ratio_c1"]
    assert result["frontend"]["bench"]["calls"] == 2 * result["config"]["sentences"]
    assert result["frontend_p99_ms"] > 0 and result["frontend_share_of_ttfa_c1"] > 0
    for name in ("bench.md", "throughput_vs_concurrency.png", "latency_cdf.png", "ttfa_vs_concurrency.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    md = (out / "bench.md").read_text()
    for name in FIGURES:
        assert name in md
    for heading in ("## Text front end", "## Baselines", "### Open loop", "### Under load, as deployed",
                    "## Overload burst", "#### Ceilings and where the rest goes"):
        assert heading in md
    # the gateway phase ran at 1 and 16 (one request per stream) on both paths without error
    assert [lv["concurrency"] for lv in result["gateway"]["levels"]] == [1, 16]
    for lv in result["gateway"]["levels"]:
        assert lv["direct"]["ok"] == lv["gateway"]["ok"] == lv["concurrency"], lv["errors"]
        assert lv["gateway"]["audio_s_total"] == pytest.approx(lv["direct"]["audio_s_total"])
    assert all(result[name] > 0 for name in GATEWAY_FIGURES)
    assert "## OpenAI gateway overhead" in md
    # time to first byte per format: every format answered, each figure a p50 difference from pcm
    first = result["gateway"]["first_byte"]
    assert all(len(v["first_byte_s"]) == first["runs"] and "error" not in v for v in first["formats"].values())
    assert all(result[name] is not None for name in FIRST_BYTE_FIGURES) and "first body byte" in md
    # the two streaming doors took turns at 1 and 16 on the same jobs, every request completed
    assert [(r["door"], r["concurrency"]) for r in result["doors"]["levels"]] == [
        (d, c) for c in (1, 16) for d in DOORS]
    for row in result["doors"]["levels"]:
        assert row["ok"] == row["requests"] == max(2, row["concurrency"]), row["errors"]
        assert all(r["tokens"] == 16 for r in row["records"]) and row["cpu_ms_per_token"] > 0
    for name in DOOR_FIGURES:  # a pipeline efficiency may be null under outside load, with the reason
        row = next((r for r in result["doors"]["levels"] if r["concurrency"] == 16 and name.endswith(
            "bls" if r["door"] == contract.MODEL_STREAM else "ensemble")), {})
        assert (result[name] is not None and result[name] > 0) or row.get("pipeline_efficiency_null"), name
    assert "## The two streaming doors" in md
    # the segmentation modes and the reference voice, one request each, all completed
    assert {k: m["ok"] for k, m in result["modes"].items()} == dict.fromkeys(MODE_KEYS, 1)
    assert all(result[key] > 0 for key in MODE_KEYS.values()) and "## Segmentation modes" in md
    # the WebSocket phase replayed text at LLM speed at 1 and 8 connections, every sentence spoken
    assert [lv["concurrency"] for lv in result["ws"]["levels"]] == [1, 8]
    for lv in result["ws"]["levels"]:
        assert lv["ok"] == lv["connections"] == lv["concurrency"], lv["errors"]
        assert lv["sentences_with_audio"] == lv["sentences"] >= 2 * lv["connections"]
        assert 0.0 < lv["sentence_latency_p50_s"] <= lv["sentence_latency_max_s"]
        assert lv["needed_buffer_max_s"] >= lv["sentence_buffer_max_s"] >= 0.0
        assert 0.0 <= lv["gapless_fraction"] <= 1.0
        for r in lv["records"]:
            assert r["audio_s"] == pytest.approx(r["sentences"] * 16 * 512 / 24000, abs=0.05)
            assert len(r["sentence_buffer_s"]) == len(r["sentence_latency_s"]) == r["sentences"]
    assert all(isinstance(result[k], float) for k in WS_FIGURES), {k: result[k] for k in WS_FIGURES}
    assert "## Text at LLM speed" in md


@pytest.mark.server
@pytest.mark.timeout(90)
def test_locust_smoke_every_user_type_succeeds(triton_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "loadtest"
    from chattts_serving.gateway import GatewaySettings

    with running_gateway(GatewaySettings(triton_url=triton_server.grpc_url, api_key="locust-key")) as gateway:
        # one user per class (Locust spreads users over the four classes evenly)
        env = {**os.environ, "USERS": "4", "SPAWN_RATE": "4", "DURATION": "5s", "OUT_DIR": str(out),
               "CHATTTS_HOST": "127.0.0.1", "CHATTTS_HTTP_PORT": str(triton_server.http_port),
               "CHATTTS_GRPC_PORT": str(triton_server.grpc_port), "CHATTTS_MAX_NEW_TOKENS": "16",
               "CHATTTS_GATEWAY_PORT": gateway.rsplit(":", 1)[1], "CHATTTS_API_KEY": "locust-key",
               "LOCUST": str(Path(sys.executable).parent / "locust")}
        proc = subprocess.run(["bash", str(ROOT / "loadtest" / "run.sh")], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=80)
    stats_csv = out / "locust_stats.csv"
    assert stats_csv.is_file(), proc.stderr[-3000:]
    rows = {row["Type"]: row for row in csv.DictReader(stats_csv.open()) if row["Name"] != "Aggregated"}
    assert rows.keys() >= LOCUST_TYPES, (rows.keys(), proc.stderr[-2000:])
    for t in LOCUST_TYPES:
        assert int(rows[t]["Request Count"]) > 0, t
        assert int(rows[t]["Failure Count"]) == 0, (t, (out / "locust_failures.csv").read_text())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "report.html").is_file()
    audio = json.loads((out / "audio_summary.json").read_text())["per_type"]
    assert {"grpc", "sse", "http", "gateway"} <= audio.keys()
    assert all(a["audio_s"] > 0 and a["chunks"] >= a["requests"] > 0 for a in audio.values())


# --- pure helpers -------------------------------------------------------------------------
def test_llm_tokens_cover_the_text_and_each_sentence_ends_in_the_delta_of_its_last_character() -> None:
    text = "你好，欢迎。The weather is 25.5 today.  明天见！"
    deltas = tokens_of(text)
    assert "".join(deltas) == text
    assert deltas[:6] == ["你", "好", "，", "欢", "迎", "。"] and "25.5 " in deltas and "today.  " in deltas
    assert [deltas[i][-1:] if not deltas[i].strip() else deltas[i].strip()[-1] for i in last_deltas(deltas)] \
        == ["。", ".", "！"]


def test_sentences_are_real_chinese_of_10_to_50_chars() -> None:
    sentences = load_sentences()
    assert len(sentences) >= 10
    for s in sentences:
        assert 10 <= len(s) <= 50, s
        assert not any(ch.isdigit() for ch in s), s  # ChatTTS' normaliser would drop digits


def test_summarize_percentiles_throughput_and_failures() -> None:
    recs = [RequestRecord(i, "t", 0.0, 0.1 * (i + 1), 1.0 + i, 2.0, 3, 90, tokens_requested=100, degraded=i == 3,
                          vocoder="codes" if i == 3 else "hidden") for i in range(4)]
    recs.append(RequestRecord(4, "t", 0.0, None, 0.5, 0.0, 0, 0, error="boom", tokens_requested=100,
                              outcome="server_error"))
    s = summarize(recs, wall_s=4.0)
    assert (s["requests"], s["ok"], s["failed"]) == (5, 4, 1)
    assert s["outcomes"] == {"completed": 4, "server_error": 1}
    assert s["latency_p50_s"] == pytest.approx(2.5)
    assert s["ttfa_p50_s"] == pytest.approx(0.25)
    assert s["requests_per_s"] == pytest.approx(1.0)
    assert s["audio_s_per_s"] == pytest.approx(2.0)
    assert s["tokens_per_s"] == pytest.approx(90.0)  # generated, as the server reported them
    assert s["tokens_requested_per_s"] == pytest.approx(100.0)
    assert s["rtf_mean"] == pytest.approx((1 + 2 + 3 + 4) / 4 / 2.0)
    assert s["degraded_requests"] == 1 and s["vocoders"] == {"hidden": 3, "codes": 1}
    assert summarize([], 0.0)["latency_p50_s"] is None


def test_needed_buffer_is_the_worst_lateness_against_playback_from_the_first_chunk() -> None:
    sr = 24000
    # chunks of 0.1 s arriving every 0.1 s: never late
    assert needed_buffer_s([0.5, 0.6, 0.7], [2400, 2400, 2400], sr) == pytest.approx(0.0)
    # the third chunk arrives 0.25 s after the first; the 0.2 s of audio before it ran out at 0.2 s
    assert needed_buffer_s([1.0, 1.1, 1.25], [2400, 2400, 2400], sr) == pytest.approx(0.05)
    # an early lead is kept: a slow chunk after a long one needs no buffer
    assert needed_buffer_s([0.0, 0.05, 0.9], [24000, 2400, 2400], sr) == pytest.approx(0.0)
    assert needed_buffer_s([], []) is None
    recs = [RequestRecord(0, "t", 0.0, 0.5, 0.7, 0.3, 3, 10, chunk_times_s=(0.5, 0.6, 0.7),
                          chunk_samples=(2400, 2400, 2400)),
            RequestRecord(1, "t", 0.0, 1.0, 1.25, 0.3, 3, 10, chunk_times_s=(1.0, 1.1, 1.25),
                          chunk_samples=(2400, 2400, 2400)),
            RequestRecord(2, "t", 0.0, None, 0.1, 0.0, 0, 0, error="x")]
    rt = realtime_summary(recs)
    assert rt["realtime_fraction"] == pytest.approx(1 / 3)  # a failed request is not real time
    assert rt["start_buffer_max_s"] == pytest.approx(0.05)


def test_realtime_streams_is_the_largest_level_reached_without_a_failing_level_below() -> None:
    lv = [{"concurrency": c, "realtime_fraction": f} for c, f in ((1, 1.0), (2, 0.96), (4, 0.5), (8, 1.0))]
    assert realtime_streams(lv) == (2, None)
    assert realtime_streams([{"concurrency": 1, "realtime_fraction": 0.9}]) == (0, None)
    skewed = [{"concurrency": 1, "realtime_fraction": 1.0, "other_cpu_percent": OUTSIDE_LOAD_WARN_PERCENT + 1}]
    value, reason = realtime_streams(skewed)
    assert value is None and reason is not None and "outside load" in reason
    value, reason = realtime_streams([{"concurrency": 1, "realtime_fraction": 1.0, "degraded_requests": 2}])
    assert value is None and reason is not None and "degraded" in reason


def _figures_input() -> tuple[dict, dict]:
    levels = [{"concurrency": 1, "ttfa_p50_s": 0.2, "rtf_p50": 0.5, "realtime_fraction": 1.0, "tokens_per_s": 50.0,
               "wall_s": 2.0, "cpu_s_by_process": {"chattts_vocoder": 0.2, "chattts_gpt": 1.0}},
              {"concurrency": 16, "audio_s_per_s": 6.0, "latency_p50_s": 2.0, "latency_p95_s": 2.4,
               "tokens_per_s": 270.0, "realtime_fraction": 0.5, "wall_s": 4.0,
               "cpu_s_by_process": {"chattts_vocoder": 1.62, "chattts_dvae_vocoder": 0.54, "chattts_gpt": 3.0}}]
    prof = {"levels": levels, "pipeline": {"tokens_per_s": 300.0},
            "raw_step": {"batches": {"1": {"step_ms_p50": 8.0}, "4": {"step_ms_p50": 12.0},
                                     "16": {"step_ms_p50": 30.0}}},
            "floor": {"floor_ms": {"1": 4.0, "4": 8.0, "16": 15.0}},
            "open_loop": {"ttfa_p95_over_p50": 2.0, "rtf_p95_over_p50": 1.5},
            "burst": {"saturated": {"busy_p99_s": 0.05, "offline": {"busy_p99_s": 0.08},
                                    "gateway": {"busy_p99_s": 0.09}},
                      "burst": {"busy_p99_s": 0.02}},
            "as_deployed": {"audio_s_per_s": 7.0, "degraded_requests": 8, "requests": 16}}
    baseline = {"offline": {"audio_s_per_s": 0.5}, "batched": {"audio_s_per_s": 2.0},
                "stream": {"first_chunk_p50_s": 4.0}, "stream_smallest": {"first_chunk_p50_s": 0.8}}
    return prof, baseline


def test_profile_figures_name_their_baselines_and_meet_targets() -> None:
    prof, baseline = _figures_input()
    f, nulls = profile_figures(prof, baseline)
    assert nulls == {}
    assert f.pop("gpt_step_ms") == {"1": 8.0, "4": 12.0, "16": 30.0}
    assert f == pytest.approx({
        "throughput_ratio_c16": 12.0, "throughput_ratio_c16_vs_batched": 3.0, "ttfa_ratio_c1": 0.05,
        "ttfa_ratio_c1_vs_stream_smallest": 0.25, "p95_over_p50_c16": 1.2, "ttfa_p95_over_p50_open_loop": 2.0,
        "rtf_p95_over_p50_open_loop": 1.5, "pipeline_efficiency_c16": 0.9, "realtime_streams": 1, "rtf_c1": 0.5,
        "busy_p99_s_saturated": 0.05, "busy_p99_s_burst": 0.02, "throughput_ratio_c16_as_deployed": 14.0,
        "busy_p99_s_offline_saturated": 0.08, "busy_p99_s_gateway_saturated": 0.09,
        "degraded_fraction_as_deployed": 0.5, "gpt_step_ms_b1": 8.0, "gpt_step_ms_b4": 12.0, "gpt_step_ms_b16": 30.0,
        "gpt_floor_ms_b1": 4.0, "gpt_floor_ms_b4": 8.0, "gpt_floor_ms_b16": 15.0, "step_over_floor_b1": 2.0,
        "step_over_floor_b4": 1.5, "vocoder_cpu_ms_per_token": 2.0, "vocoder_cpu_ms_per_token_c1": 2.0})
    assert set(f) == set(FIGURES)
    for name in ("throughput_ratio_c16", "ttfa_ratio_c1", "p95_over_p50_c16", "pipeline_efficiency_c16",
                 "busy_p99_s_saturated", "busy_p99_s_offline_saturated", "busy_p99_s_gateway_saturated"):
        assert target_met(name, f[name]) is True, name
    assert target_met("throughput_ratio_c16", 12.0, "cpu-int8") is False  # the int8 profile aims at 15
    assert target_met("p95_over_p50_c16", 1.5) is False and target_met("rtf_c1", None) is None
    assert target_met("step_over_floor_b1", 1.4) is False and target_met("step_over_floor_b1", 1.4, "cpu-int8") is True
    assert target_met("step_over_floor_b4", 1.6, "cpu-int8") is False and target_met("step_over_floor_b4", 9.0) is None


def test_a_degraded_or_skewed_level_nulls_its_figures_with_the_reason() -> None:
    prof, baseline = _figures_input()
    prof["levels"][1]["degraded_requests"] = 3
    prof["levels"][0]["other_cpu_percent"] = 150.0
    f, nulls = profile_figures(prof, baseline)
    for name in ("throughput_ratio_c16", "throughput_ratio_c16_vs_batched", "p95_over_p50_c16",
                 "pipeline_efficiency_c16"):
        assert f[name] is None and "degraded" in nulls[name], name
    for name in ("ttfa_ratio_c1", "rtf_c1", "realtime_streams"):
        assert f[name] is None and "outside load" in nulls[name], name
    assert f["throughput_ratio_c16_as_deployed"] == pytest.approx(14.0)  # degraded requests are its point
    prof, baseline = _figures_input()
    baseline["batched"] = None
    f, nulls = profile_figures(prof, baseline)
    assert f["throughput_ratio_c16_vs_batched"] is None
    assert "upstream batched: not measured" in nulls["throughput_ratio_c16_vs_batched"]


def test_every_error_has_one_outcome_by_kind_and_status() -> None:
    assert classify_error(ClientError(encode(ErrorKind.BUSY, "server busy"))) == Outcome.REFUSED_BUSY
    assert classify_error(ClientError(encode(ErrorKind.INVALID, "text is empty"))) == Outcome.REFUSED_INVALID
    assert classify_error(ClientError(encode(ErrorKind.INTERNAL, "internal error: X"))) == Outcome.SERVER_ERROR
    assert classify_error(ClientError(encode(ErrorKind.UNAVAILABLE, "breaker open"))) == Outcome.SERVER_ERROR
    assert classify_error(ClientError("no response within 5 s", TIMEOUT)) == Outcome.CLIENT_TIMEOUT
    assert classify_error(ClientError("cannot connect", "StatusCode.UNAVAILABLE", connection=True)) \
        == Outcome.TRANSPORT_ERROR
    # untagged UNAVAILABLE is Triton's own queue refusing the request (errors.kind_from_status)
    assert classify_error(ClientError("queue full", "StatusCode.UNAVAILABLE")) == Outcome.REFUSED_BUSY
    assert classify_error(ClientError("Stream removed", "StatusCode.INTERNAL")) == Outcome.TRANSPORT_ERROR
    assert classify_error(ValueError("client bug")) == Outcome.TRANSPORT_ERROR
    assert list(count_outcomes({"completed": 3})) == [str(o) for o in Outcome]


def test_open_loop_plan_is_reproducible_poisson_with_mixed_budgets() -> None:
    sentences = load_sentences()
    plan = open_loop_plan(sentences, 400, 100, rate_per_s=2.0)
    assert plan == open_loop_plan(sentences, 400, 100, rate_per_s=2.0)
    offsets = [off for off, _ in plan]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] / 399 == pytest.approx(0.5, rel=0.15)  # mean gap 1 / rate
    assert {j.tokens for _, j in plan} == {round(s * 100) for s in BUDGET_SCALES}
    assert len({j.text for _, j in plan}) > 1 and len({j.seed for _, j in plan}) == 400


def test_default_path_profile_only_moves_the_degradation_thresholds_out_of_reach() -> None:
    shipped = load_profile("cpu")
    bench = default_path_profile(shipped)
    assert bench.degrade.live_high == UNREACHABLE_STREAMS and bench.degrade.ttfa_p95_high_s >= 1e9
    assert bench.degrade.queued_high == UNREACHABLE_STREAMS  # every signal of the degraded mode
    assert bench.model_dump(exclude={"degrade"}) == shipped.model_dump(exclude={"degrade"})
    assert bench.degrade.chunk_scale == shipped.degrade.chunk_scale


def test_soak_accounting_confirms_cancels_on_the_server_and_finds_the_lost() -> None:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    client = {"a": "completed", "b": "cancel_requested", "c": "cancel_requested", "d": "cancel_requested",
              "e": "refused_invalid", "f": "completed"}
    server = {"a": "ok", "b": "cancelled", "c": "ok", "e": "rejected:invalid", "f": "error"}
    final, mismatches = soak.reconcile(client, {"b", "c", "d"}, server)
    assert final == {"a": "completed", "b": "cancelled", "c": "completed", "e": "refused_invalid", "f": "completed"}
    assert len(mismatches) == 2 and any(m.startswith("d:") for m in mismatches)  # unconfirmed cancel: lost
    outcomes = count_outcomes({"completed": 3, "cancelled": 1, "refused_invalid": 1})
    assert soak.counters_agree(outcomes, {"status:ok": 3, "status:cancelled": 1, "rejected:invalid": 1}) == []
    assert soak.counters_agree(outcomes, {"status:ok": 2, "status:cancelled": 1, "rejected:invalid": 1,
                                          "status:error": 1}) != []


def test_prometheus_diff_gives_batch_histogram_and_model_counters() -> None:
    def exposition(count: int, execs: int, compute_us: int, buckets: tuple[int, int, int], total: int,
                   steps: int) -> str:  # the shape of Triton's /metrics: HELP and TYPE lines, then samples
        voc = 'model="chattts_vocoder",version="1"'
        return (f"# HELP nv_inference_count Number of inferences performed\n# TYPE nv_inference_count counter\n"
                f"nv_inference_count{{{voc}}} {count}\n"
                f"# TYPE nv_inference_exec_count counter\nnv_inference_exec_count{{{voc}}} {execs}\n"
                f"# TYPE nv_inference_compute_infer_duration_us counter\n"
                f"nv_inference_compute_infer_duration_us{{{voc}}} {compute_us}\n"
                "# TYPE tts_engine_batch_size histogram\n"
                + "".join(f'tts_engine_batch_size_bucket{{model="chattts_gpt",le="{le}"}} {n}\n'
                          for le, n in zip(("1", "4", "+Inf"), buckets))
                + f'tts_engine_batch_size_sum{{model="chattts_gpt"}} {total}\n'
                f'tts_engine_batch_size_count{{model="chattts_gpt"}} {buckets[-1]}\n'
                f'# TYPE tts_engine_decode_steps_total counter\ntts_engine_decode_steps_total{{model="chattts_gpt"}} '
                f"{steps}\n")

    before = parse_prometheus(exposition(10, 10, 0, (5, 5, 5), 5, 0))
    after = parse_prometheus(exposition(30, 15, 2_000_000, (6, 9, 9), 17, 4))
    assert ("nv_inference_count_total", (("model", "chattts_vocoder"), ("version", "1"))) in after
    delta = diff_samples(before, after)
    voc = model_stats(delta)["chattts_vocoder"]
    assert voc["requests"] == 20 and voc["mean_batch"] == pytest.approx(4.0) and voc["compute_s"] == 2.0
    eng = engine_batches(delta)
    assert eng == {"decode_steps": 4, "rows": 12, "mean_batch": 3.0, "histogram": {"<=1": 1, "<=4": 3}}
    assert engine_batches(diff_samples({}, {})) is None


def test_prometheus_parser_refuses_what_is_not_an_exposition() -> None:
    with pytest.raises(ValueError):
        parse_prometheus('tts_request_total{status="ok" 3\n')  # unclosed label set


@pytest.mark.server
def test_a_real_triton_exposition_parses_with_labels(triton_server) -> None:  # type: ignore[no-untyped-def]
    from chattts_serving import contract
    from chattts_serving.bench.serverload import scrape
    from chattts_serving.client import SynthesisRequest, synthesize_stream

    synthesize_stream(triton_server.grpc_url, SynthesisRequest(text="指标。", max_new_tokens=4, min_new_tokens=4))
    samples = scrape(f"http://127.0.0.1:{triton_server.metrics_port}/metrics")
    stream = model_stats(diff_samples({}, samples)).get(contract.MODEL_STREAM)
    assert stream is not None and stream["requests"] >= 1 and stream["executions"] >= 1, model_stats(samples)
    buckets = {dict(labels)["le"] for (name, labels), _ in samples.items() if name == "tts_engine_batch_size_bucket"}
    assert "+Inf" in buckets and len(buckets) > 2, buckets
    engine = engine_batches(diff_samples({}, samples))
    # 4 tokens: the prefill gives the first, 3 decode steps the rest
    assert engine is not None and engine["decode_steps"] >= 3 and engine["rows"] >= 3, engine


def test_frontend_figures_are_p99_and_share_of_ttfa_at_c1() -> None:
    fe = {"bench": {"p50_ms": 2.0, "p99_ms": 5.0}, "numbers": {"p50_ms": 8.0, "p99_ms": 20.0}}
    figures = frontend_figures(fe, [{"concurrency": 1, "ttfa_p50_s": 0.4}, {"concurrency": 4, "ttfa_p50_s": 1.0}])
    assert figures == pytest.approx({"frontend_p99_ms": 5.0, "frontend_share_of_ttfa_c1": 0.005,
                                     "frontend_numbers_p99_ms": 20.0, "frontend_numbers_share_of_ttfa_c1": 0.02})
    assert frontend_figures(fe, [])["frontend_share_of_ttfa_c1"] is None


def test_gateway_figures_are_gateway_over_direct_at_1_and_16() -> None:
    def level(c: int, ttfa_direct: float, ttfa_gateway: float, direct_tput: float, gateway_tput: float) -> dict:
        return {"concurrency": c, "direct": {"ttfa_p50_s": ttfa_direct, "audio_s_per_s": direct_tput},
                "gateway": {"ttfa_p50_s": ttfa_gateway, "audio_s_per_s": gateway_tput}}

    result = {"levels": [level(1, 0.2, 0.25, 1.0, 0.9), level(16, 1.0, 1.1, 4.0, 3.8)]}
    assert gateway_figures(result) == pytest.approx({"gateway_ttfa_ratio_c1": 1.25, "gateway_ttfa_ratio_c16": 1.1,
                                                     "gateway_throughput_ratio_c16": 0.95})
    assert gateway_figures({"error": "did not start", "levels": []}) == dict.fromkeys(GATEWAY_FIGURES)
    assert gateway_figures(None)["gateway_ttfa_ratio_c1"] is None


def test_first_byte_figures_are_each_formats_p50_over_pcms() -> None:
    gateway = {"first_byte": {"gap_p50_s": {"wav": 0.0, "mp3": 0.01, "opus": 0.0, "aac": 0.02, "flac": -0.01}}}
    assert first_byte_figures(gateway) == {"gateway_first_byte_gap_s_wav": 0.0, "gateway_first_byte_gap_s_mp3": 0.01,
                                           "gateway_first_byte_gap_s_opus": 0.0, "gateway_first_byte_gap_s_aac": 0.02,
                                           "gateway_first_byte_gap_s_flac": -0.01}
    assert first_byte_figures({"error": "did not start"}) == dict.fromkeys(FIRST_BYTE_FIGURES)
