"""Refine-text mode: ChatTTS' ``_refine_text`` computed by our engine, against ChatTTS itself.

Greedy text-mode decoding through the engine (mixed in one batch with code sequences that
join and leave) equals ChatTTS' ``GPT.generate(infer_text=True)`` token for token; its end
token and ``min_new_token`` behave as ChatTTS'; prompts, decoding and the code-stage prompt
equal ChatTTS' own; the text sampler keeps exactly what ChatTTS' processors keep; parameters
are validated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from chattts_serving import contract
from chattts_serving.contract import TEXT_EOS_ID, SequenceMode
from chattts_serving.engine.gpt import Embeddings, GptStepRunner
from chattts_serving.engine.sampling import RequestSampler, sample_text_batch
from chattts_serving.engine.scheduler import Engine, EngineConfig
from chattts_serving.engine.sequence import Sequence, make_sequence
from chattts_serving.engine.sinks import CollectingSink
from chattts_serving.export.parity import chattts_prompt
from chattts_serving.params import ParamError, SamplingParams
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.request import refine_input
from chattts_serving.text.refine import (
    BREAK_0_ID,
    RefineParams,
    code_prompt_ids,
    code_stage_text,
    decode_refined,
    load_tokenizer,
    refine_prompt_ids,
)
from chattts_serving.text.speaker import normalize_speaker
from tests.support.engine_helpers import refine_sequence, text_ids

TEXTS = ("你好，欢迎使用流式语音合成。", "ChatTTS 在 Triton 上。")
GREEDY = 1e-5  # temperature: ChatTTS' softmax and ours both put all mass on the argmax


Collect = CollectingSink


@pytest.fixture(scope="module")
def tokenizer(small_artifacts: Artifacts):  # type: ignore[no-untyped-def]
    return load_tokenizer(small_artifacts.root)


def _chattts_refine_ids(chat, text: str, n: int, min_new: int = 0,  # type: ignore[no-untyped-def]
                        prompt: str = "") -> np.ndarray:
    """ChatTTS' own refine stage (its tokenizer, Embed, LlamaModel, head_text, processors)."""
    params = chat.RefineTextParams(temperature=GREEDY, manual_seed=0, max_new_token=n, min_new_token=min_new,
                                   show_tqdm=False, prompt=prompt)
    res = chat._refine_text([text], torch.device("cpu"), params)
    return res.ids[0].numpy().astype(np.int64)


def _greedy(n: int, min_new: int = 0) -> RefineParams:
    return RefineParams(temperature=GREEDY, max_new_tokens=n, min_new_tokens=min_new)


def _run(engine: Engine) -> None:
    while engine.live_count():
        engine.run_once()


# ---- prompts and decoding ---------------------------------------------------------------------
@pytest.mark.parametrize("text,prompt", [(TEXTS[0], ""), (TEXTS[1], ""), ("你好[uv_break]，我在笑[laugh]。", ""),
                                         (TEXTS[0], "[oral_2][laugh_0][break_6]")])
def test_refine_prompt_ids_equal_chattts(small_chat, tokenizer, text: str, prompt: str) -> None:  # type: ignore[no-untyped-def]
    chat = small_chat
    ref_ids, _, text_mask = chat.tokenizer.encode(chat.speaker.decorate_text_prompts([text], prompt), contract.NUM_VQ)
    ours = refine_prompt_ids(tokenizer, text, prompt)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, ref_ids[0, :, 0].numpy())
    assert bool(text_mask.all())  # ChatTTS embeds the whole refine prompt with emb_text
    assert ours[0] == tokenizer.convert_tokens_to_ids("[Sbreak]")


def test_decode_drops_break_tokens_and_keeps_uv_break_and_laugh_as_chattts(small_chat, tokenizer) -> None:  # type: ignore[no-untyped-def]
    chat = small_chat
    tok = tokenizer
    pieces = ["你", "好", "[uv_break]", "，", "[break_3]", "欢", "迎", "[laugh]", "[speed_5]", "[oral_2]", "[laugh_0]",
              "[lbreak]", "c", "##h", "a", "[Stts]", "[break_0]", "[music]", "。"]
    ids = np.array(tok.convert_tokens_to_ids(pieces), np.int64)
    assert (ids >= BREAK_0_ID).sum() == 5 and chat.tokenizer.break_0_ids == BREAK_0_ID
    t = torch.from_numpy(ids)
    ref = chat.tokenizer.decode([t[t.less(chat.tokenizer.break_0_ids)]])[0]  # ChatTTS' Chat._infer
    got = decode_refined(tok, ids)
    assert got == ref
    assert "[uv_break]" in got and "[laugh]" in got and "[break_3]" not in got and "[speed_5]" not in got
    assert decode_refined(tok, np.zeros(0, np.int64)) == chat.tokenizer.decode([torch.zeros(0, dtype=torch.long)])[0]


@pytest.mark.parametrize("refined", ["你 好 [uv_break] ， 欢 迎 [laugh] 。", "  [Stts] 你 好 [spk_emb] 。 ",
                                     "c h a t [empty_spk] t t s"])
def test_code_prompt_of_refined_text_equals_chattts(small_chat, tokenizer, refined: str) -> None:  # type: ignore[no-untyped-def]
    chat = small_chat
    for speed in (5, 2):
        prompts = chat.speaker.decorate_code_prompts([refined], f"[speed_{speed}]", None, "any-speaker")
        ref_ids, _, _ = chat.tokenizer.encode(prompts, contract.NUM_VQ)
        np.testing.assert_array_equal(code_prompt_ids(tokenizer, refined, "unused", speed), ref_ids[0, :, 0].numpy())


def test_code_stage_falls_back_to_the_unrefined_text_when_nothing_speakable_is_left(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert code_stage_text("", "原文。") == "原文。"
    assert code_stage_text(" [uv_break] [Stts] 。", "原文。") == "原文。"
    assert code_stage_text("[Stts] 好 。", "原文。") == "好 。"
    ids = code_prompt_ids(tokenizer, "[laugh]", "原文。")
    assert tokenizer.convert_ids_to_tokens(ids.tolist()) == ["[Stts]", "[spk_emb]", "[speed_5]", "原", "文", "。",
                                                             "[Ptts]"]
    with pytest.raises(ValueError, match="speed"):
        code_prompt_ids(tokenizer, "好", "好", speed=10)


# ---- the engine in text mode vs ChatTTS' GPT.generate(infer_text=True) ---------------------------
def test_greedy_text_mode_equals_chattts_mixed_with_code_sequences(small_chat, small_artifacts: Artifacts,
                                                                  tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Three text sequences and two code sequences share the batch, joining and leaving at
    different steps (up to four rows at once, two of them text; the third text sequence takes
    the first's finished row); each equals ChatTTS' own generation token for token."""
    chat = small_chat
    n_text, n_code = 12, 40
    oral = "[oral_2][laugh_0][break_6]"
    ref_a = _chattts_refine_ids(chat, TEXTS[0], n_text)
    ref_b = _chattts_refine_ids(chat, TEXTS[1], 2 * n_text)
    ref_c = _chattts_refine_ids(chat, TEXTS[0], n_text, prompt=oral)
    assert len(ref_a) == n_text and len(ref_b) == 2 * n_text and not np.array_equal(ref_a, ref_c)

    torch.manual_seed(3)
    spk = chat.speaker.sample_random()
    code_params = chat.InferCodeParams(spk_emb=spk, temperature=GREEDY, manual_seed=0, max_new_token=n_code,
                                       min_new_token=n_code, show_tqdm=False)
    ref_code = next(chat._infer_code([TEXTS[0]], False, torch.device("cpu"), True, code_params))
    code_ids = chattts_prompt(chat, [TEXTS[0]], spk)[0][0, :, 0].numpy().astype(np.int64)
    spk_vec = normalize_speaker(chat.speaker._decode(spk).astype(np.float32))

    engine = Engine(GptStepRunner(small_artifacts), Embeddings(small_artifacts), EngineConfig())

    def code_seq() -> tuple[Sequence, Collect]:
        sink = Collect()
        return make_sequence(code_ids, spk_vec, SamplingParams(temperature=GREEDY, max_new_tokens=n_code,
                                                          min_new_tokens=n_code), sink, emit_tokens=5), sink

    code1, code1_sink = code_seq()
    engine.submit(code1)
    engine.run_once()
    engine.run_once()
    text_a, text_b, text_c = Collect(), Collect(), Collect()
    engine.submit(refine_sequence(refine_prompt_ids(tokenizer, TEXTS[0]), _greedy(n_text), text_a, emit_tokens=4))
    engine.run_once()
    code2, code2_sink = code_seq()
    engine.submit(code2)
    engine.run_once()
    engine.run_once()
    engine.submit(refine_sequence(refine_prompt_ids(tokenizer, TEXTS[1]), _greedy(2 * n_text), text_b, emit_tokens=7))
    while not text_a.reason:
        engine.run_once()
    assert not text_b.reason
    engine.submit(refine_sequence(refine_prompt_ids(tokenizer, TEXTS[0], oral), _greedy(n_text), text_c))
    _run(engine)

    for sink, ref in ((text_a, ref_a), (text_b, ref_b), (text_c, ref_c)):
        assert sink.errors == []
        np.testing.assert_array_equal(text_ids(sink.all_codes), ref)
        assert sink.reason == contract.StopReason.MAX_TOKENS
    for sink in (code1_sink, code2_sink):
        np.testing.assert_array_equal(sink.all_codes, ref_code.ids[0].numpy())
        np.testing.assert_allclose(np.concatenate(sink.hidden), ref_code.hiddens[0].numpy(), atol=1e-4)
    stats = engine.stats()
    assert max(int(k) for k in stats["batch_sizes"]) == 4  # type: ignore[attr-defined]
    assert int(stats["row_reuses"]) >= 1  # type: ignore[call-overload]
    # the decoded text is what ChatTTS' Chat.infer(refine_text_only=True) returns
    ref_text = chat.infer(TEXTS[0], skip_refine_text=False, refine_text_only=True, split_text=False,
                          do_text_normalization=False, do_homophone_replacement=False,
                          params_refine_text=chat.RefineTextParams(temperature=GREEDY, manual_seed=0,
                                                                   max_new_token=n_text, show_tqdm=False))
    assert decode_refined(tokenizer, text_ids(text_a.all_codes)) == ref_text[0]


@pytest.fixture(scope="module")
def swap(small_chat, small_artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Weights under which greedy refinement ends with [Ebreak] at step k: the text-head rows
    of [Ebreak] and of the token ChatTTS picks first at step k are swapped, in a copy of the
    artifacts and (inside ``swapped()``) in ChatTTS' own Embed. Yields (artifacts, k, swapped)."""
    chat = small_chat
    ids = _chattts_refine_ids(chat, TEXTS[0], 24)
    k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
    a, b = int(ids[k]), TEXT_EOS_ID
    assert b not in ids
    root = tmp_path_factory.mktemp("swapped")
    for p in small_artifacts.root.iterdir():
        if p.name != contract.EMBED_FILE:
            (root / p.name).symlink_to(p)
    with np.load(small_artifacts.root / contract.EMBED_FILE) as data:
        arrays = {name: data[name].copy() for name in data.files}
    arrays["head_text"][[a, b]] = arrays["head_text"][[b, a]]
    np.savez(root / contract.EMBED_FILE, **arrays)

    @contextmanager
    def swapped() -> Iterator[None]:
        par = chat.embed.head_text.parametrizations.weight
        with torch.no_grad():
            for t in (par.original0, par.original1):
                t[[a, b]] = t[[b, a]].clone()
        try:
            yield
        finally:
            with torch.no_grad():
                for t in (par.original0, par.original1):
                    t[[a, b]] = t[[b, a]].clone()

    yield Artifacts.load(root), k, swapped


def test_end_token_and_min_new_tokens_behave_as_chattts(small_chat, tokenizer, swap) -> None:  # type: ignore[no-untyped-def]
    art, k, swapped = swap
    engine = Engine(GptStepRunner(art), Embeddings(art), EngineConfig())
    prompt = refine_prompt_ids(tokenizer, TEXTS[0])
    with swapped():
        ref_eos = _chattts_refine_ids(small_chat, TEXTS[0], 24)
        ref_min = _chattts_refine_ids(small_chat, TEXTS[0], 24, min_new=k + 2)
    assert len(ref_eos) == k  # ChatTTS stopped at [Ebreak] and did not return it
    assert len(ref_min) > k
    ends, mins = Collect(), Collect()
    engine.submit(refine_sequence(prompt, _greedy(24), ends))
    engine.submit(refine_sequence(prompt, _greedy(24, min_new=k + 2), mins))
    _run(engine)
    np.testing.assert_array_equal(text_ids(ends.all_codes), ref_eos)
    assert ends.reason == contract.StopReason.EOS
    assert TEXT_EOS_ID not in text_ids(ends.all_codes)
    np.testing.assert_array_equal(text_ids(mins.all_codes), ref_min)


# ---- sampler ----------------------------------------------------------------------------------
def _chattts_text_filtered(logits: np.ndarray, history: np.ndarray, p: SamplingParams) -> np.ndarray:
    """ChatTTS' gen_logits processors/warpers as _refine_text builds them (num_code = 21178), on
    (1, V) logits; the history is given as the (1, steps) ids its repetition processor takes."""
    from ChatTTS.model.processors import gen_logits

    warpers, processors = gen_logits(num_code=contract.TEXT_VOCAB_SIZE, top_P=p.top_p, top_K=p.top_k,
                                     repetition_penalty=p.repetition_penalty)
    x = torch.from_numpy(logits.copy()) / p.temperature
    tokens = torch.from_numpy(history[None, :].copy())
    for proc in (*processors, *warpers):
        x = proc(tokens, x)
    return x.numpy()


@pytest.mark.parametrize("params", [RefineParams().sampling_params(),  # top-p binds: 16 kept
                                    RefineParams(temperature=1.2, top_p=0.95, top_k=200).sampling_params(),  # 32
                                    RefineParams(top_p=0.1, top_k=1, repetition_penalty=1.0).sampling_params(),  # 3
                                    RefineParams(repetition_penalty=1.5, top_p=0.9, top_k=10).sampling_params()])  # 10
def test_text_sampler_can_draw_exactly_the_tokens_chattts_keeps(params: SamplingParams) -> None:
    """The ids drawn over 1000 seeds are exactly the ids ChatTTS' processors and warpers leave
    finite: 40 ids stand 12 above the rest (after the temperature) so that top-p and top-k
    cut inside them and every kept id has a few percent of the mass; the three strongest were
    generated before (a repetition penalty pushes them out)."""
    rng = np.random.default_rng(0)
    v, draws = contract.TEXT_VOCAB_SIZE, 1000
    logits = rng.normal(0, 1.0, (1, v))
    head = rng.choice(v, 40, replace=False)
    logits[0, head] += 12.0 + rng.normal(0, 0.3, 40)
    logits = (logits * params.temperature).astype(np.float32)
    strongest = head[np.argsort(logits[0, head])[-3:]]
    history = np.concatenate([strongest, rng.integers(0, v, 3)])
    allowed = np.isfinite(_chattts_text_filtered(logits, history, params))[0]
    samplers = []
    for draw in range(draws):
        s = RequestSampler(SamplingParams(**{**params.__dict__, "seed": draw}))
        for h in history:
            s.record(np.full(contract.NUM_VQ, h))
        samplers.append(s)
    ids = sample_text_batch(np.repeat(logits, len(samplers), 0), samplers, TEXT_EOS_ID)
    drawn, kept = set(ids.tolist()), set(np.flatnonzero(allowed).tolist())
    assert drawn == kept, (f"drawn but filtered out by ChatTTS {sorted(drawn - kept)}, "
                           f"kept by ChatTTS but never drawn {sorted(kept - drawn)}")


def test_text_filter_keeps_the_same_set_as_transformers_warpers() -> None:
    """The text mode's partial-sort top-p/top-k keeps exactly what transformers' TopP then TopK
    warpers (min_tokens_to_keep=3, as ChatTTS builds them) keep, over scales from soft to
    greedy (temperature 1e-5) and every kind of top_p/top_k edge."""
    from transformers.generation import TopKLogitsWarper, TopPLogitsWarper

    from chattts_serving.engine.sampling import _top_p_top_k_row

    rng = np.random.default_rng(5)
    for trial in range(300):
        scale = [0.1, 1.0, 3.0, 10.0, 1e5][trial % 5]
        top_p = [0.05, 0.3, 0.7, 0.9, 0.99, 1.0][trial % 6]
        top_k = [1, 2, 3, 5, 20, 200, contract.TEXT_VOCAB_SIZE][trial % 7]
        x = rng.normal(0, scale, contract.TEXT_VOCAB_SIZE).astype(np.float32)
        ref = torch.from_numpy(x[None].copy())
        for warper in (TopPLogitsWarper(top_p, min_tokens_to_keep=3), TopKLogitsWarper(top_k, min_tokens_to_keep=3)):
            ref = warper(None, ref)
        ours = x.copy()
        _top_p_top_k_row(ours, top_p, top_k)
        np.testing.assert_array_equal(np.isfinite(ours), torch.isfinite(ref)[0].numpy(), err_msg=f"trial {trial}")
        np.testing.assert_array_equal(ours[np.isfinite(ours)], x[np.isfinite(ours)])


def test_text_sampler_probabilities_follow_chattts_softmax() -> None:
    """Empirical distribution of 4000 draws vs ChatTTS' post-filter softmax (total variation)."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.0, (1, contract.TEXT_VOCAB_SIZE)).astype(np.float32)
    logits[0, :30] += 4.0
    params = RefineParams().sampling_params()
    filtered = _chattts_text_filtered(logits, np.zeros(0, np.int64), params)
    p_ref = torch.softmax(torch.from_numpy(filtered), -1).numpy()[0]
    samplers = [RequestSampler(SamplingParams(**{**params.__dict__, "seed": i})) for i in range(4000)]
    ids = sample_text_batch(np.repeat(logits, len(samplers), 0), samplers, TEXT_EOS_ID)
    counts = np.bincount(ids, minlength=logits.shape[1]) / len(ids)
    assert 0.5 * np.abs(counts - p_ref).sum() < 0.05


def test_text_sampler_suppresses_the_end_token_before_min_new_tokens() -> None:
    logits = np.full((1, contract.TEXT_VOCAB_SIZE), -10.0, np.float32)
    logits[0, TEXT_EOS_ID] = 10.0
    s = RequestSampler(RefineParams(min_new_tokens=3, seed=1).sampling_params())
    for step in range(5):
        i = sample_text_batch(logits, [s], TEXT_EOS_ID)[0]
        assert (i == TEXT_EOS_ID) == (step >= 3)
        s.record(np.full(contract.NUM_VQ, i))


# ---- parameters and requests ------------------------------------------------------------------
def test_refine_defaults_are_chattts_refine_text_params(small_chat) -> None:  # type: ignore[no-untyped-def]
    ref = small_chat.RefineTextParams()
    ours = RefineParams()
    assert (ours.prompt, ours.temperature, ours.top_p, ours.top_k, ours.repetition_penalty, ours.max_new_tokens,
            ours.min_new_tokens) == (ref.prompt, ref.temperature, ref.top_P, ref.top_K, ref.repetition_penalty,
                                     ref.max_new_token, ref.min_new_token)
    sp = ours.validate().sampling_params()
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens) == (0.7, 0.7, 20, 384)


@pytest.mark.parametrize("bad,needle", [
    (dict(temperature=0.0), "refine_temperature"), (dict(temperature=float("nan")), "refine_temperature"),
    (dict(top_p=0.0), "refine_top_p"), (dict(top_p=1.01), "refine_top_p"),
    (dict(top_k=0), "refine_top_k"), (dict(top_k=21179), "refine_top_k"), (dict(top_k=2.5), "refine_top_k"),
    (dict(repetition_penalty=0.9), "refine_repetition_penalty"), (dict(max_new_tokens=0), "refine_max_new_tokens"),
    (dict(max_new_tokens=5000), "refine_max_new_tokens"), (dict(min_new_tokens=-1), "refine_min_new_tokens"),
    (dict(min_new_tokens=10, max_new_tokens=5), "refine_min_new_tokens"), (dict(seed=-1), "refine_seed"),
    (dict(seed=True), "refine_seed"), (dict(seed=2**64), "refine_seed"), (dict(top_p="0.5"), "refine_top_p"),
    (dict(prompt="[oral_2]hello"), "refine_prompt"),
    (dict(prompt="[speed_5]"), "refine_prompt"), (dict(prompt="[break_8]"), "refine_prompt"),
    (dict(prompt="[oral_1]" * 17), "refine_prompt"),
])
def test_out_of_range_refine_parameters_are_refused_with_the_name(bad: dict, needle: str) -> None:
    with pytest.raises(ParamError, match=needle):
        RefineParams(**bad).validate()


def test_valid_edges_pass_and_the_cap_applies() -> None:
    RefineParams(temperature=5.0, top_p=1.0, top_k=contract.TEXT_VOCAB_SIZE, repetition_penalty=10.0,
                 max_new_tokens=4096, min_new_tokens=4096, seed=2**63 - 1,
                 prompt="[oral_2][laugh_0][break_6]").validate()
    RefineParams(top_k=20.0, temperature=1).validate()  # integral floats and int temperatures are fine
    with pytest.raises(ParamError, match="cap"):
        RefineParams(max_new_tokens=500).validate(max_new_tokens_cap=384)
    with pytest.raises(ParamError):
        refine_sequence(np.array([1, 2]), RefineParams(top_k=0), Collect())


def test_refine_params_are_read_from_request_tensors() -> None:
    from chattts_serving.errors import RequestError

    assert refine_input({}) == RefineParams()
    got = refine_input({"temperature": np.array([0.2], np.float32), "top_k": np.array([1000], np.int32),
                                     "seed": np.array([7], np.int64)}, max_new_tokens_cap=384)
    assert (got.temperature, got.top_k, got.seed, got.top_p) == (pytest.approx(0.2), 1000, 7, 0.7)
    got = refine_input({"refine_max_new_tokens": np.array([20], np.int32),
                                     "max_new_tokens": np.array([1], np.int32)}, prefix="refine_")
    assert got.max_new_tokens == 20
    for bad in ({"top_k": np.array([0], np.int32)}, {"top_k": np.array([5.0], np.float32)},
                {"temperature": np.array([0.5, 0.6], np.float32)}, {"max_new_tokens": np.array([500], np.int32)}):
        with pytest.raises(RequestError) as info:
            refine_input(bad, max_new_tokens_cap=384)
        assert info.value.kind == "invalid"


def test_engine_refuses_bad_text_sequences(small_artifacts: Artifacts, tokenizer,
                                          tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = Engine(GptStepRunner(small_artifacts), Embeddings(small_artifacts), EngineConfig())
    prompt = refine_prompt_ids(tokenizer, TEXTS[0])
    spk = np.ones(small_artifacts.hidden_size, np.float32)
    with pytest.raises(ValueError, match="speaker"):
        engine.submit(make_sequence(prompt, spk, RefineParams().sampling_params(), Collect(), mode=SequenceMode.TEXT))
    with pytest.raises(ValueError, match="mode"):
        engine.submit(make_sequence(prompt, None, RefineParams().sampling_params(), Collect(), mode="texts"))
    with pytest.raises(ValueError, match="empty"):
        refine_prompt_ids(tokenizer, "  ")
    with pytest.raises(ValueError):
        text_ids(np.array([[1, 1, 1, 2]]))
    # artifacts exported before the text head: refused at submit with the fix in the message
    for p in small_artifacts.root.iterdir():
        if p.name != contract.EMBED_FILE:
            (tmp_path / p.name).symlink_to(p)
    with np.load(small_artifacts.root / contract.EMBED_FILE) as data:
        np.savez(tmp_path / contract.EMBED_FILE, emb_text=data["emb_text"], emb_code=data["emb_code"])
    old = Artifacts.load(tmp_path)
    old_engine = Engine(GptStepRunner(old), Embeddings(old), EngineConfig())
    with pytest.raises(ValueError, match="make export"):
        old_engine.submit(refine_sequence(prompt, RefineParams(), Collect()))
    with pytest.raises(RuntimeError, match="make export"):
        Embeddings(old).text_logits(np.zeros((1, old.hidden_size), np.float32))
    # code sequences still run on such artifacts
    sink = Collect()
    old_engine.submit(make_sequence(np.array([21131, 21143, 300, 21132]), spk, SamplingParams(max_new_tokens=3), sink))
    _run(old_engine)
    assert sink.reason in (contract.StopReason.EOS, contract.StopReason.MAX_TOKENS) and not sink.errors
