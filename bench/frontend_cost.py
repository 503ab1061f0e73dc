"""The text front end's cost per request: ``FrontEnd.prepare`` timed in process, no server.

Every request pays for normalisation (our rules, WeTextProcessing on the kinds routed to it,
ChatTTS' normaliser), the vocabulary check and tokenisation before its prefill; this measures
that time on the benchmark's own sentences (the requests whose TTFA the benchmark reports) and
on sentences full of numbers, dates, times, money and phone numbers (the worst case for
normalisation), with the profile's ``[frontend]`` settings.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .stats import mean, percentile

NUMBER_SENTENCES: Final = (
    "他4-0获胜，从0-3追到3-3，比分3:2。",
    "营业时间9:00-17:00，需要3-5天，2024年3月5日起执行。",
    "17：20分出发，下午3:30分开始，15:16:36秒结束。",
    "客服电话 400 820 6666，卡号6222 0212 3456 7890。",
    "2瓶水和2杯咖啡，还有2双鞋，一共¥88.8元。",
    "6000+小时；1809.93美元/盎司；7.5元/升。",
    "GDP增长5.2%，涨幅在2%-3%之间，约1/3的人支持。",
    "气温-5℃，风速10m/s，PM2.5浓度75μg/m³。",
    "请拨打13812345678或访问www.example.com。",
    "It costs $12.50 and opens at 2:30pm on 03/05.",
)
"""Number-heavy sentences (the kinds of issue #11): the front end's worst case."""


def time_prepare(frontend: Any, sentences: Sequence[str], repeats: int) -> dict[str, float | int | None]:
    """Wall time of ``frontend.prepare(s)`` per call over ``repeats`` passes of ``sentences``
    (one untimed pass first): {"calls", "p50_ms", "p99_ms", "mean_ms", "max_ms", "chars_mean"}."""
    for s in sentences:
        frontend.prepare(s)
    times: list[float] = []
    for _ in range(repeats):
        for s in sentences:
            t0 = time.perf_counter()
            frontend.prepare(s)
            times.append((time.perf_counter() - t0) * 1000.0)
    return {"calls": len(times), "p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99),
            "mean_ms": mean(times), "max_ms": max(times) if times else None,
            "chars_mean": mean([float(len(s)) for s in sentences])}


def measure_frontend(artifacts_dir: Path, profile: Any, sentences: Sequence[str], repeats: int) -> dict[str, Any]:
    """``FrontEnd.prepare`` per call, as the ``chattts_frontend`` model runs it for ``profile``:
    {"wetext", "setup_s", "bench": time_prepare(benchmark sentences), "numbers":
    time_prepare(:data:`NUMBER_SENTENCES`)}. Times are milliseconds, ``setup_s`` seconds (the
    front end's construction: tokenizer, ChatTTS' normaliser, the wetext library)."""
    from chattts_serving.runtime import Artifacts
    from chattts_serving.text.frontend import FrontEnd

    fp = profile.frontend
    t0 = time.perf_counter()
    fe = FrontEnd(Artifacts.load(artifacts_dir), fp.max_text_chars, fp.default_voice_seed, wetext=fp.wetext)
    setup_s = time.perf_counter() - t0
    return {"wetext": fp.wetext, "setup_s": setup_s, "bench": time_prepare(fe, sentences, repeats),
            "numbers": time_prepare(fe, NUMBER_SENTENCES, repeats)}
