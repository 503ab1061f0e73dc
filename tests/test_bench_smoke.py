"""The benchmark and load-test harnesses keep working (small config, seconds; no speed asserted).

- ``python -m chattts_serving.bench --smoke`` runs every part (raw step, ChatTTS baseline, a
  real server at two levels) and writes the JSON, the Markdown report and the plots.
- ``loadtest/run.sh`` drives Locust headless against the session's test server and every user
  type completes requests without a failure.
- The benchmark's pure helpers (percentiles, Prometheus diffs, ratios) compute what they say.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_serving.bench import load_sentences
from chattts_serving.bench.report import TARGETS, frontend_figures, headline_ratios, target_met
from chattts_serving.bench.stats import (
    RequestRecord,
    diff_samples,
    engine_batches,
    model_stats,
    parse_prometheus,
    summarize,
)

ROOT = Path(__file__).resolve().parent.parent

LEVEL_KEYS = {"concurrency", "requests", "ok", "failed", "wall_s", "ttfa_p50_s", "ttfa_p95_s", "latency_p50_s",
              "latency_p95_s", "latency_p99_s", "requests_per_s", "audio_s_per_s", "rtf_mean",
              "engine_tokens_per_s", "engine", "models", "cpu_percent", "cpu_s_by_process", "rss_mb",
              "rss_mb_peak", "records"}
TOP_KEYS = {"config", "machine", "baseline", "raw_step", "levels", "throughput_ratio_c16", "ttfa_ratio_c1",
            "p95_over_p50_c16", "engine_efficiency_c16", "started_at", "elapsed_s", "frontend", "frontend_p99_ms",
            "frontend_share_of_ttfa_c1"}
LOCUST_TYPES = {"grpc:ttfa", "grpc:total", "sse:ttfa", "sse:total", "http:infer"}


@pytest.mark.server
@pytest.mark.timeout(150)
def test_bench_smoke_writes_report(small_weights: Path, small_artifacts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "chattts_serving.bench", "--smoke", "--artifacts", str(small_artifacts.root),
         "--weights", str(small_weights), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert result.keys() >= TOP_KEYS
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
    for lv in result["levels"]:
        assert lv.keys() >= LEVEL_KEYS, LEVEL_KEYS - lv.keys()
        assert lv["ok"] == lv["requests"] == 2, lv["errors"]
    assert result["baseline"]["offline"]["ok"] == 2
    assert result["baseline"]["stream"]["first_chunk_p50_s"] is not None
    assert set(result["raw_step"]["batches"]) == {"1", "16"}
    assert result["config"]["tokens"] == 16
    assert result["ttfa_ratio_c1"] is not None  # level 1 ran; the c16 ratios are None in smoke
    assert result["frontend"]["bench"]["calls"] == 2 * result["config"]["sentences"]
    assert result["frontend_p99_ms"] > 0 and result["frontend_share_of_ttfa_c1"] > 0
    for name in ("bench.md", "throughput_vs_concurrency.png", "latency_cdf.png", "ttfa_vs_concurrency.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    md = (out / "bench.md").read_text()
    for name in TARGETS:
        assert name in md
    assert "## Text front end" in md


@pytest.mark.server
@pytest.mark.timeout(90)
def test_locust_smoke_every_user_type_succeeds(triton_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "loadtest"
    # one user per class (Locust spreads users over the three classes evenly)
    env = {**os.environ, "USERS": "3", "SPAWN_RATE": "3", "DURATION": "5s", "OUT_DIR": str(out),
           "CHATTTS_HOST": "127.0.0.1", "CHATTTS_HTTP_PORT": str(triton_server.http_port),
           "CHATTTS_GRPC_PORT": str(triton_server.grpc_port), "CHATTTS_MAX_NEW_TOKENS": "16",
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
    assert {"grpc", "sse", "http"} <= audio.keys()
    assert all(a["audio_s"] > 0 and a["chunks"] >= a["requests"] > 0 for a in audio.values())


# --- pure helpers -------------------------------------------------------------------------
def test_sentences_are_real_chinese_of_10_to_50_chars() -> None:
    sentences = load_sentences()
    assert len(sentences) >= 10
    for s in sentences:
        assert 10 <= len(s) <= 50, s
        assert not any(ch.isdigit() for ch in s), s  # ChatTTS' normaliser would drop digits


def test_summarize_percentiles_throughput_and_failures() -> None:
    recs = [RequestRecord(i, "t", 0.0, 0.1 * (i + 1), 1.0 + i, 2.0, 3, 100) for i in range(4)]
    recs.append(RequestRecord(4, "t", 0.0, None, 0.5, 0.0, 0, 100, error="boom"))
    s = summarize(recs, wall_s=4.0)
    assert (s["requests"], s["ok"], s["failed"]) == (5, 4, 1)
    assert s["latency_p50_s"] == pytest.approx(2.5)
    assert s["ttfa_p50_s"] == pytest.approx(0.25)
    assert s["requests_per_s"] == pytest.approx(1.0)
    assert s["audio_s_per_s"] == pytest.approx(2.0)
    assert s["tokens_per_s"] == pytest.approx(100.0)
    assert s["rtf_mean"] == pytest.approx((1 + 2 + 3 + 4) / 4 / 2.0)
    assert summarize([], 0.0)["latency_p50_s"] is None


def test_prometheus_diff_gives_batch_histogram_and_model_counters() -> None:
    before = parse_prometheus(
        '# HELP x\nnv_inference_count{model="chattts_vocoder",version="1"} 10\n'
        'nv_inference_exec_count{model="chattts_vocoder",version="1"} 10\n'
        'tts_engine_batch_size_bucket{model="chattts_gpt",le="1"} 5\n'
        'tts_engine_batch_size_bucket{model="chattts_gpt",le="4"} 5\n'
        'tts_engine_batch_size_bucket{model="chattts_gpt",le="+Inf"} 5\n'
        'tts_engine_batch_size_sum{model="chattts_gpt"} 5\ntts_engine_batch_size_count{model="chattts_gpt"} 5\n')
    after = parse_prometheus(
        'nv_inference_count{model="chattts_vocoder",version="1"} 30\n'
        'nv_inference_exec_count{model="chattts_vocoder",version="1"} 15\n'
        'nv_inference_compute_infer_duration_us{model="chattts_vocoder",version="1"} 2000000\n'
        'tts_engine_batch_size_bucket{model="chattts_gpt",le="1"} 6\n'
        'tts_engine_batch_size_bucket{model="chattts_gpt",le="4"} 9\n'
        'tts_engine_batch_size_bucket{model="chattts_gpt",le="+Inf"} 9\n'
        'tts_engine_batch_size_sum{model="chattts_gpt"} 17\ntts_engine_batch_size_count{model="chattts_gpt"} 9\n'
        'tts_engine_decode_steps_total{model="chattts_gpt"} 4\n')
    delta = diff_samples(before, after)
    voc = model_stats(delta)["chattts_vocoder"]
    assert voc["requests"] == 20 and voc["mean_batch"] == pytest.approx(4.0) and voc["compute_s"] == 2.0
    eng = engine_batches(delta)
    assert eng == {"decode_steps": 4, "rows": 12, "mean_batch": 3.0, "histogram": {"<=1": 1, "<=4": 3}}
    assert engine_batches(diff_samples({}, {})) is None


def test_headline_ratios_and_targets() -> None:
    levels = [{"concurrency": 1, "ttfa_p50_s": 0.2},
              {"concurrency": 16, "audio_s_per_s": 6.0, "latency_p50_s": 2.0, "latency_p95_s": 2.4,
               "engine_tokens_per_s": 240.0}]
    baseline = {"offline": {"audio_s_per_s": 0.5}, "stream": {"first_chunk_p50_s": 4.0}}
    raw = {"batches": {"16": {"tokens_per_s": 300.0}}}
    r = headline_ratios(baseline, levels, raw)
    assert r == pytest.approx({"throughput_ratio_c16": 12.0, "ttfa_ratio_c1": 0.05, "p95_over_p50_c16": 1.2,
                               "engine_efficiency_c16": 0.8})
    assert all(target_met(k, v) for k, v in r.items())
    assert headline_ratios(baseline, levels[:1], raw)["throughput_ratio_c16"] is None
    assert target_met("p95_over_p50_c16", 1.5) is False


def test_frontend_figures_are_p99_and_share_of_ttfa_at_c1() -> None:
    fe = {"bench": {"p50_ms": 2.0, "p99_ms": 5.0}, "numbers": {"p50_ms": 8.0, "p99_ms": 20.0}}
    figures = frontend_figures(fe, [{"concurrency": 1, "ttfa_p50_s": 0.4}, {"concurrency": 4, "ttfa_p50_s": 1.0}])
    assert figures == pytest.approx({"frontend_p99_ms": 5.0, "frontend_share_of_ttfa_c1": 0.005,
                                     "frontend_numbers_p99_ms": 20.0, "frontend_numbers_share_of_ttfa_c1": 0.02})
    assert frontend_figures(fe, [])["frontend_share_of_ttfa_c1"] is None
