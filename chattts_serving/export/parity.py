"""Parity of the exported graphs against ChatTTS' own torch modules, on the same inputs.

The references are computed only with what a loaded ``ChatTTS.Chat`` holds (its tokenizer,
``Speaker``, ``Embed``, the LlamaModel, ``Decoder``, ``DVAE`` and ``Vocos``), never with the
export wrappers, so a wrapper bug shows up as a parity error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import contract
from ..audio.vocoder import VocoderRunner
from ..engine.gpt import Embeddings, GptStepRunner
from ..runtime import FP16_GRAPH_FILES, Artifacts, OrtOptions
from ..text.speaker import normalize_speaker

PARITY_TEXTS = ("你好，欢迎使用流式语音合成服务。", "ChatTTS 在 Triton 上。")


def _artifacts_for(chat: Any, root: Path) -> Artifacts:
    cfg = chat.gpt.gpt.config
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    return Artifacts(Path(root), {"config": {
        "num_layers": int(cfg.num_hidden_layers), "hidden_size": int(cfg.hidden_size), "num_heads": heads,
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)},
        "precisions": {"fp16": dict(FP16_GRAPH_FILES)}})


def right_padded(embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Left-padded rows (ChatTTS' tokenizer pads on the left; ``mask`` (B, T) 1 for real
    positions) moved to the right-padded layout the fused graph's prefill takes."""
    out = np.zeros_like(embeds)
    for r, m in enumerate(mask.astype(bool)):
        out[r, :int(m.sum())] = embeds[r, m]
    return out


def chattts_prompt(chat: Any, texts: list[str], spk: str | None) -> tuple[Any, Any, Any]:
    """ChatTTS' prompt for ``texts``: (input_ids (B, T, 4), attention_mask (B, T), emb (B, T, H)),
    built by its tokenizer, ``Speaker.decorate_code_prompts``, ``Embed`` and ``Speaker.apply``."""
    import torch

    prompts = chat.speaker.decorate_code_prompts(list(texts), "[speed_5]", None, spk)
    input_ids, attn, text_mask = chat.tokenizer.encode(prompts, contract.NUM_VQ)
    emb = chat.embed(input_ids, text_mask).clone()
    if spk is not None:
        chat.speaker.apply(emb, spk, input_ids, chat.tokenizer.spk_emb_ids, torch.device("cpu"))
    return input_ids, attn, emb


def parity_report(chat: Any, root: Path, opts: OrtOptions | None = None,
                  scales: dict[str, float] | None = None) -> dict[str, float]:
    """Max absolute error per stage between ChatTTS' modules and the graphs in ``root``, run
    with ``opts`` (``opts.precision="fp16"``: the fp16 graph files, ``opts.providers``: e.g.
    the CUDA EP). When ``scales`` is given it receives, per stage, the largest absolute value
    of the reference (for relative errors: error / scale).

    Stages: ``gpt_prefill_logits``, ``gpt_prefill_hidden`` (batch of 2 prompts of different
    lengths, with a speaker: ChatTTS left-pads them, the fused graph takes them right-padded),
    ``gpt_decode_logits``, ``gpt_decode_hidden`` (one step after it, rows of different
    lengths), ``gpt_decode_spare_columns_logits`` (that step in a wider cache of garbage
    columns, between two rows that hold nothing),
    ``embed_prompt`` (numpy lookups vs ``Embed`` + ``Speaker.apply``), ``vocoder_hidden``
    and ``vocoder_codes`` (batch of 2, 40 tokens), and the refine-text mode (see
    :func:`text_mode_parity`): ``text_head_logits``, ``gpt_text_prefill_logits``,
    ``gpt_text_decode_logits``.
    """
    import torch

    art = _artifacts_for(chat, root)
    opts = opts or OrtOptions()
    report: dict[str, float] = {}
    scale: dict[str, float] = {} if scales is None else scales
    torch.manual_seed(1234)
    spk = chat.speaker.sample_random()
    input_ids, attn, emb = chattts_prompt(chat, list(PARITY_TEXTS), spk)
    llama = chat.gpt.gpt

    def heads(h: Any) -> Any:
        return torch.stack([chat.embed.head_code[q](h) for q in range(contract.NUM_VQ)], 1)

    with torch.no_grad():
        pos = attn.long().cumsum(-1) - 1
        pos.masked_fill_(attn == 0, 1)
        out = llama(inputs_embeds=emb, attention_mask=attn, position_ids=pos, use_cache=True)
        h_ref = out.last_hidden_state[:, -1]
        logits_ref = heads(h_ref)

    # ORT prefill with the numpy embedding path (speaker vector as the front end sends it).
    emb_np = Embeddings(art)
    spk_vec = np.frombuffer(_decode_spk(chat, spk), dtype=np.float16).astype(np.float32)
    ids = input_ids[:, :, 0].numpy().astype(np.int64)
    mask = attn.numpy().astype(np.int64)
    rows = [emb_np.prompt(row, normalize_speaker(spk_vec)) for row in ids]
    embeds = np.stack(rows).astype(np.float32)
    real = mask.astype(bool)
    report["embed_prompt"] = float(np.abs(embeds[real] - emb.numpy()[real]).max())
    scale["embed_prompt"] = float(np.abs(emb.numpy()[real]).max())
    runner = GptStepRunner(art, opts)
    lengths = mask.sum(1)
    logits, hidden, cache = runner.prefill(right_padded(embeds, mask), lengths)
    report["gpt_prefill_logits"] = float(np.abs(logits - logits_ref.numpy()).max())
    report["gpt_prefill_hidden"] = float(np.abs(hidden - h_ref.numpy()).max())
    scale["gpt_prefill_logits"] = float(np.abs(logits_ref.numpy()).max())
    scale["gpt_prefill_hidden"] = float(np.abs(h_ref.numpy()).max())

    # One decode step on the argmax codes.
    codes = logits_ref.argmax(-1)  # (B, 4)
    with torch.no_grad():
        step_emb = torch.stack([chat.embed.emb_code[q](codes[:, q]) for q in range(contract.NUM_VQ)], 2).sum(2)
        attn2 = torch.cat([attn, torch.ones(attn.shape[0], 1, dtype=attn.dtype)], 1)
        pos2 = (attn2.long().cumsum(-1) - 1)[:, -1:]
        out2 = llama(inputs_embeds=step_emb[:, None], attention_mask=attn2, position_ids=pos2,
                     past_key_values=out.past_key_values, use_cache=True)
        h2_ref = out2.last_hidden_state[:, -1]
        logits2_ref = heads(h2_ref)
    step_np = emb_np.codes(codes.numpy().astype(np.int64))[:, None, :].astype(np.float32)
    batch = runner.new_cache(len(ids), int(lengths.max()) + 1)
    for r in range(len(ids)):
        batch.copy_row(r, cache, r, int(lengths[r]))
    logits2, hidden2 = runner.decode(step_np, batch, lengths)
    report["gpt_decode_logits"] = float(np.abs(logits2 - logits2_ref.numpy()).max())
    report["gpt_decode_hidden"] = float(np.abs(hidden2 - h2_ref.numpy()).max())
    scale["gpt_decode_logits"] = scale["gpt_decode_spare_columns_logits"] = float(np.abs(logits2_ref.numpy()).max())
    scale["gpt_decode_hidden"] = float(np.abs(h2_ref.numpy()).max())
    # The same step in a wider cache whose columns after each row's positions hold garbage,
    # as the engine's preallocated rows do, in rows 1 and 2 of 4 (rows 0 and 3 hold no
    # sequence: length 0).
    spare = 5
    rng = np.random.default_rng(3)
    wide = runner.new_cache(len(ids) + 2, int(lengths.max()) + 1 + spare)
    for buf in wide.buffers:
        buf[...] = rng.normal(size=buf.shape).astype(buf.dtype)
    for r in range(len(ids)):
        wide.copy_row(r + 1, cache, r, int(lengths[r]))
    step_wide = np.concatenate([np.zeros_like(step_np[:1]), step_np, np.zeros_like(step_np[:1])])
    logits3, _ = runner.decode(step_wide, wide, np.concatenate([[0], lengths, [0]]))
    report["gpt_decode_spare_columns_logits"] = float(np.abs(logits3[1:-1] - logits2_ref.numpy()).max())

    report.update(text_mode_parity(chat, art, h_ref.numpy(), opts, scale))

    # Vocoders.
    hidden_size = art.hidden_size
    g = torch.Generator().manual_seed(7)
    hid = torch.randn(2, 40, hidden_size, generator=g)
    cds = torch.randint(0, 625, (2, 40, contract.NUM_VQ), generator=g, dtype=torch.int32)
    with torch.no_grad():
        wav_h = chat.vocos.decode(chat.decoder(hid.transpose(1, 2).contiguous())).numpy()
        wav_c = chat.vocos.decode(chat.dvae(cds.permute(0, 2, 1).contiguous())).numpy()
    got_h = VocoderRunner(art, "hidden", opts).run(hid.numpy())
    got_c = VocoderRunner(art, "codes", opts).run(cds.numpy())
    if got_h.shape != wav_h.shape or got_c.shape != wav_c.shape:
        raise RuntimeError(f"vocoder output shapes differ: {got_h.shape} vs {wav_h.shape}, "
                           f"{got_c.shape} vs {wav_c.shape}")
    report["vocoder_hidden"] = float(np.abs(got_h - wav_h).max())
    report["vocoder_codes"] = float(np.abs(got_c - wav_c).max())
    scale["vocoder_hidden"] = float(np.abs(wav_h).max())
    scale["vocoder_codes"] = float(np.abs(wav_c).max())
    return report


def text_mode_parity(chat: Any, art: Artifacts, hidden: np.ndarray, opts: OrtOptions | None = None,
                     scales: dict[str, float] | None = None) -> dict[str, float]:
    """Max absolute error of the refine-text mode (ChatTTS' ``Chat._refine_text`` and
    ``GPT.generate(infer_text=True)``) between ChatTTS' modules and our numpy + ONNX path.

    ``text_head_logits``: ``Embeddings.text_logits`` (hidden @ W.T with the exported
    materialised W) vs ``Embed.head_text`` (weight-normed) on the same hidden states (B, H).
    ``gpt_text_prefill_logits``: the refine prompt ``[Sbreak]{text}[Pbreak]`` of
    :data:`PARITY_TEXTS` (batch of 2, left-padded), embedded by ``Embed`` from ChatTTS'
    tokenizer (no speaker) and run through the LlamaModel and ``head_text``, vs
    ``Embeddings.prompt`` + the ONNX step + ``text_logits``. ``gpt_text_decode_logits``: one
    more step on the argmax text ids, embedded with ``emb_text``. ``opts`` and ``scales`` as
    in :func:`parity_report`.
    """
    import torch

    emb_np = Embeddings(art)
    opts = opts or OrtOptions()
    report: dict[str, float] = {}
    with torch.no_grad():
        ref = chat.embed.head_text(torch.from_numpy(hidden)).numpy()
    report["text_head_logits"] = float(np.abs(emb_np.text_logits(hidden) - ref).max())
    scale: dict[str, float] = {} if scales is None else scales
    scale["text_head_logits"] = float(np.abs(ref).max())

    prompts = chat.speaker.decorate_text_prompts(list(PARITY_TEXTS), "")
    input_ids, attn, text_mask = chat.tokenizer.encode(prompts, contract.NUM_VQ)
    llama = chat.gpt.gpt
    with torch.no_grad():
        emb = chat.embed(input_ids, text_mask).clone()
        pos = attn.long().cumsum(-1) - 1
        pos.masked_fill_(attn == 0, 1)
        out = llama(inputs_embeds=emb, attention_mask=attn, position_ids=pos, use_cache=True)
        logits_ref = chat.embed.head_text(out.last_hidden_state[:, -1])
        nxt = logits_ref.argmax(-1)  # (B,)
        attn2 = torch.cat([attn, torch.ones(attn.shape[0], 1, dtype=attn.dtype)], 1)
        pos2 = (attn2.long().cumsum(-1) - 1)[:, -1:]
        out2 = llama(inputs_embeds=chat.embed.emb_text(nxt)[:, None], attention_mask=attn2, position_ids=pos2,
                     past_key_values=out.past_key_values, use_cache=True)
        logits2_ref = chat.embed.head_text(out2.last_hidden_state[:, -1])

    ids = input_ids[:, :, 0].numpy().astype(np.int64)
    mask = attn.numpy().astype(np.int64)
    embeds = np.stack([emb_np.prompt(row, None) for row in ids]).astype(np.float32)
    runner = GptStepRunner(art, opts)
    lengths = mask.sum(1)
    _, hid, cache = runner.prefill(right_padded(embeds, mask), lengths)
    report["gpt_text_prefill_logits"] = float(np.abs(emb_np.text_logits(hid) - logits_ref.numpy()).max())
    step = emb_np.text(nxt.numpy().astype(np.int64))[:, None, :].astype(np.float32)
    batch = runner.new_cache(len(ids), int(lengths.max()) + 1)
    for r in range(len(ids)):
        batch.copy_row(r, cache, r, int(lengths[r]))
    _, hid2 = runner.decode(step, batch, lengths)
    report["gpt_text_decode_logits"] = float(np.abs(emb_np.text_logits(hid2) - logits2_ref.numpy()).max())
    scale["gpt_text_prefill_logits"] = float(np.abs(logits_ref.numpy()).max())
    scale["gpt_text_decode_logits"] = float(np.abs(logits2_ref.numpy()).max())
    return report


def _decode_spk(chat: Any, spk: str) -> bytes:
    return chat.speaker._decode(spk).tobytes()


def encoder_parity_audio(chat: Any) -> list[np.ndarray]:
    """The recordings the DVAE-encoder parity check uses (24 kHz float32, deterministic):
    the shortest accepted length (513 samples), white noise, a chirp with noise, and speech-like
    audio decoded by the checkpoint's own DVAE + Vocos from random codes (the kind of audio the
    encoder sees in ChatTTS' first-piece prompt)."""
    import torch

    rng = np.random.default_rng(11)
    sr = contract.SAMPLE_RATE_HZ
    t = np.arange(3 * sr) / sr
    chirp = 0.3 * np.sin(2 * np.pi * (100 + 1500 * t) * t) + rng.normal(0, 0.01, t.size)
    g = torch.Generator().manual_seed(5)
    cds = torch.randint(0, 625, (1, contract.NUM_VQ, 120), generator=g, dtype=torch.int32)
    with torch.no_grad():
        decoded = chat.vocos.decode(chat.dvae(cds)).numpy()[0]
    return [rng.normal(0, 0.1, contract.ENCODER_MIN_SAMPLES).astype(np.float32),
            rng.normal(0, 0.1, sr + 77).astype(np.float32),
            chirp.astype(np.float32), decoded.astype(np.float32)]


def encoder_parity(chat: Any, root: Path, opts: OrtOptions | None = None) -> dict[str, float]:
    """Codes of the exported DVAE encoder vs ChatTTS' ``DVAE.sample_audio`` on
    :func:`encoder_parity_audio`: ``codes`` compared, ``mismatched_codes``,
    ``mismatch_fraction``, and ``length_mismatches`` (recordings whose token count differs;
    always expected 0)."""
    from ..audio.encoder import DvaeEncoderRunner

    runner = DvaeEncoderRunner(_artifacts_for(chat, root), opts or OrtOptions())
    total = bad = lengths = 0
    for wav in encoder_parity_audio(chat):
        ref = chat.dvae.sample_audio(wav.copy()).numpy().T  # (T, 4)
        got = runner.run(wav)
        if got.shape != ref.shape:
            lengths += 1
            continue
        total += ref.size
        bad += int((got != ref).sum())
    return {"codes": float(total), "mismatched_codes": float(bad),
            "mismatch_fraction": bad / max(total, 1), "length_mismatches": float(lengths)}
