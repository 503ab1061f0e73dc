"""The benchmark's pure helpers compute what they say, without a server: LLM-speed deltas, the
sentences, percentiles and real-time summaries, figures and their targets, outcomes, the
open-loop plan, the default-path profile, Prometheus diffs and the soak's accounting.

The harnesses themselves run against real servers in tests/server/test_bench_smoke.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench import load_sentences
from bench.figures import (
    FIGURES,
    OUTSIDE_LOAD_WARN_PERCENT,
    frontend_figures,
    profile_figures,
    realtime_streams,
    target_met,
)
from bench.gatewayload import FIRST_BYTE_FIGURES, GATEWAY_FIGURES, first_byte_figures, gateway_figures
from bench.openloop import BUDGET_SCALES, open_loop_plan
from bench.outcomes import Outcome, classify_error, count_outcomes
from bench.profiles import UNREACHABLE_STREAMS, default_path_profile
from bench.stats import (
    RequestRecord,
    diff_samples,
    engine_batches,
    model_stats,
    needed_buffer_s,
    parse_prometheus,
    realtime_summary,
    summarize,
)
from bench.wsload import last_deltas, tokens_of
from chattts_serving.client.common import TIMEOUT, ClientError
from chattts_serving.errors import ErrorKind, encode
from chattts_serving.serving.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


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
               "wall_s": 2.0, "cpu_s_by_process": {"chattts_vocoder": 0.2, "chattts_gpt": 1.0},
               "models": {"chattts_vocoder": {"requests": 9.0, "vocoded_tokens": 110.0}}},
              {"concurrency": 16, "audio_s_per_s": 6.0, "latency_p50_s": 2.0, "latency_p95_s": 2.4,
               "tokens_per_s": 270.0, "realtime_fraction": 0.5, "wall_s": 4.0,
               "cpu_s_by_process": {"chattts_vocoder": 1.62, "chattts_dvae_vocoder": 0.54, "chattts_gpt": 3.0},
               "models": {"chattts_vocoder": {"vocoded_tokens": 900.0},
                          "chattts_dvae_vocoder": {"vocoded_tokens": 288.0}, "chattts_gpt": {"requests": 16.0}}}]
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
        "step_over_floor_b4": 1.5, "step_over_floor_b16": 2.0, "vocoder_cpu_ms_per_token": 2.0,
        "vocoder_cpu_ms_per_token_c1": 2.0, "vocoded_tokens_per_token": 1.1, "vocoded_tokens_per_token_c1": 1.1})
    assert set(f) == set(FIGURES)
    for name in ("throughput_ratio_c16", "ttfa_ratio_c1", "p95_over_p50_c16", "pipeline_efficiency_c16",
                 "busy_p99_s_saturated", "busy_p99_s_offline_saturated", "busy_p99_s_gateway_saturated"):
        assert target_met(name, f[name]) is True, name
    assert target_met("throughput_ratio_c16", 12.0, "cpu-int8") is False  # the int8 profile aims at 15
    assert target_met("p95_over_p50_c16", 1.5) is False and target_met("rtf_c1", None) is None
    assert target_met("step_over_floor_b1", 1.4) is False and target_met("step_over_floor_b1", 1.25, "cpu-int8") is True
    assert target_met("step_over_floor_b1", 1.4, "cpu-int8") is False  # issue #41: 1.3
    assert target_met("realtime_streams", 2, "cpu-int8") is True
    assert target_met("realtime_streams", 1, "cpu-int8") is False
    assert target_met("step_over_floor_b4", 1.6, "cpu-int8") is False and target_met("step_over_floor_b4", 9.0) is None
    assert target_met("step_over_floor_b16", 1.6, "cpu-int8") is False
    assert target_met("step_over_floor_b16", 9.0) is None


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
