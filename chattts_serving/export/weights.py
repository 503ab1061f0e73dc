"""Where ChatTTS weights come from: a local snapshot, ChatTTS' downloader, or generated ones.

All three end in the same place: a directory in 2Noise/ChatTTS' published layout::

    asset/gpt/config.json + model.safetensors   LlamaModel (HF format)
    asset/Embed.safetensors                     code/text embeddings and weight-normed heads
    asset/Decoder.safetensors                   hidden -> mel decoder
    asset/DVAE.safetensors                      codes -> mel (FSQ dequantiser + decoder)
    asset/Vocos.safetensors                     mel -> waveform
    asset/tokenizer/                            BertTokenizerFast (21178 tokens)

which :func:`load_chat` loads through the ``ChatTTS`` package's own ``Chat._load``. A generated
checkpoint adds ``asset/chattts_serving.json`` (the module sizes it was built with, so that
``Chat.config`` can be set to match) and, when its hidden size is not ChatTTS' 768,
``asset/spk_stat.txt`` (speaker statistics in ChatTTS' base16384 format).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import contract

ASSET_FILES = ("Decoder.safetensors", "DVAE.safetensors", "Embed.safetensors", "Vocos.safetensors")
SIZES_FILE = "chattts_serving.json"
SPK_STAT_FILE = "spk_stat.txt"

# The 50 tokens ChatTTS adds after bert-base-chinese's 21128, in id order (21128..21177).
# The ids the project relies on (contract.SPECIAL_TOKEN_IDS) are checked at generation time.
ADDED_TOKENS: tuple[str, ...] = (
    "[Sbreak]", "[Pbreak]", "[Sasr]", "[Stts]", "[Ptts]", "[Pasr]", "[Easr]", "[Etts]", "[Ebreak]",
    "[uv_break]", "[v_break]", "[lbreak]", "[llbreak]", "[undefine]", "[laugh]", "[spk_emb]",
    "[empty_spk]", "[music]", "[pure]",
    *(f"[break_{i}]" for i in range(8)), *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)), *(f"[speed_{i}]" for i in range(10)),
)


class WeightsError(RuntimeError):
    """A weights source is missing, corrupt or incompatible; the message names what is wrong."""


@dataclass(frozen=True)
class ModelSizes:
    """Module sizes of a ChatTTS checkpoint.

    ``full`` is ChatTTS 0.2.5's default ``Config`` (GPT 20 layers x 768, Decoder 12 layers,
    DVAE 12 layers, Vocos 8 layers x 512). ``small`` keeps the token, mel and hop geometry
    (4 codes of 626, 100 mels, 2 mel frames per token, hop 256, n_fft 1024) and the text
    vocabulary, and shrinks every stack so that a decode step takes well under a millisecond.
    """

    name: str
    gpt_layers: int
    hidden: int
    heads: int
    ffn: int
    decoder_hidden: int
    decoder_layers: int
    decoder_bn: int
    dvae_hidden: int
    dvae_layers: int
    dvae_bn: int
    vocos_dim: int
    vocos_ffn: int
    vocos_layers: int

    @property
    def decoder_idim(self) -> int:
        """Decoder input channels: the hidden state is split into 2 mel frames per token."""
        return self.hidden // contract.MEL_FRAMES_PER_TOKEN

    @property
    def vq_dim(self) -> int:
        return 2 * self.dvae_idim

    @property
    def dvae_idim(self) -> int:
        return 512 if self.name == "full" else self.dvae_hidden


SIZES = {
    "full": ModelSizes("full", gpt_layers=20, hidden=768, heads=12, ffn=3072, decoder_hidden=512,
                       decoder_layers=12, decoder_bn=128, dvae_hidden=256, dvae_layers=12, dvae_bn=128,
                       vocos_dim=512, vocos_ffn=1536, vocos_layers=8),
    "small": ModelSizes("small", gpt_layers=2, hidden=256, heads=4, ffn=1024, decoder_hidden=128,
                        decoder_layers=2, decoder_bn=64, dvae_hidden=128, dvae_layers=2, dvae_bn=64,
                        vocos_dim=128, vocos_ffn=384, vocos_layers=2),
}


def apply_sizes(config: Any, sizes: ModelSizes) -> None:
    """Set a ``ChatTTS.config.Config`` to ``sizes`` in place (the GPT itself is sized by its
    ``asset/gpt/config.json``; Chat.config.gpt only feeds bookkeeping)."""
    config.gpt.hidden_size = sizes.hidden
    config.gpt.intermediate_size = sizes.ffn
    config.gpt.num_attention_heads = sizes.heads
    config.gpt.num_hidden_layers = sizes.gpt_layers
    config.embed.hidden_size = sizes.hidden
    dec = config.decoder
    dec.idim, dec.odim, dec.hidden, dec.n_layer, dec.bn_dim = (
        sizes.decoder_idim, sizes.decoder_idim, sizes.decoder_hidden, sizes.decoder_layers, sizes.decoder_bn)
    d = config.dvae.decoder
    d.idim, d.odim, d.hidden, d.n_layer, d.bn_dim = (
        sizes.dvae_idim, sizes.dvae_idim, sizes.dvae_hidden, sizes.dvae_layers, sizes.dvae_bn)
    e = config.dvae.encoder
    e.idim, e.odim, e.hidden, e.n_layer, e.bn_dim = (
        sizes.dvae_idim, sizes.vq_dim, sizes.dvae_hidden, sizes.dvae_layers, sizes.dvae_bn)
    config.dvae.vq.dim = sizes.vq_dim
    b = config.vocos.backbone.init_args
    b.dim, b.intermediate_dim, b.num_layers = sizes.vocos_dim, sizes.vocos_ffn, sizes.vocos_layers
    config.vocos.head.init_args.dim = sizes.vocos_dim


def _fresh_config() -> Any:
    """A ChatTTS Config whose nested dataclasses are private copies.

    ChatTTS' ``Config`` uses dataclass instances as defaults, so every ``Config()`` shares
    them: mutating one would resize every later Chat in the process. Deep-copying isolates.
    """
    import copy

    from ChatTTS.config import Config

    return copy.deepcopy(Config())


# --------------------------------------------------------------------------------------
# Validation of a snapshot directory
# --------------------------------------------------------------------------------------
def check_asset_dir(root: Path) -> Path:
    """Return ``root/asset`` after checking that every published file is present.

    Raises:
        WeightsError: naming the first missing or unreadable file.
    """
    root = Path(root)
    asset = root / "asset"
    if not root.is_dir():
        raise WeightsError(f"asset directory {root} does not exist")
    if not asset.is_dir():
        raise WeightsError(f"{root} has no asset/ folder (expected 2Noise/ChatTTS' published layout)")
    required = [asset / f for f in ASSET_FILES] + [asset / "gpt" / "config.json"]
    for p in required:
        if not p.is_file() or p.stat().st_size == 0:
            raise WeightsError(f"missing or empty {p.relative_to(root)} in {root}")
    if not any((asset / "gpt").glob("*.safetensors")):
        raise WeightsError(f"missing asset/gpt/*.safetensors in {root}")
    tok = asset / "tokenizer"
    if not (tok / "tokenizer.json").is_file() and not (tok / "vocab.txt").is_file():
        raise WeightsError(f"missing asset/tokenizer/ (tokenizer.json or vocab.txt) in {root}")
    for f in ASSET_FILES + tuple(str(p.relative_to(asset)) for p in (asset / "gpt").glob("*.safetensors")):
        _check_safetensors(asset / f)
    return asset


def _check_safetensors(path: Path) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
    except Exception as exc:  # safetensors raises several types for truncated/garbage files
        raise WeightsError(f"corrupt safetensors file {path}: {exc}") from None
    if not keys:
        raise WeightsError(f"safetensors file {path} holds no tensors")


def read_sizes(asset: Path) -> ModelSizes | None:
    """The sizes a generated checkpoint was built with, or None for a published snapshot."""
    p = asset / SIZES_FILE
    if not p.is_file():
        return None
    data = json.loads(p.read_text())
    return ModelSizes(**data["sizes"])


# --------------------------------------------------------------------------------------
# Loading through ChatTTS
# --------------------------------------------------------------------------------------
def load_chat(root: Path, *, check_tokenizer: bool = True) -> Any:
    """Load a checkpoint directory through ``ChatTTS.Chat._load`` on the CPU.

    Args:
        root: a directory holding ``asset/`` in the published layout.
        check_tokenizer: verify the tokenizer's size and special-token ids.

    Returns:
        A loaded ``ChatTTS.Chat`` (float32, CPU, eval mode).

    Raises:
        WeightsError: missing/corrupt files, a tokenizer of the wrong vocabulary size, or
            weights that do not fit the configuration.
    """
    import ChatTTS
    import torch

    asset = check_asset_dir(root)
    chat = ChatTTS.Chat(logging.getLogger("chattts_serving.chattts"))
    chat.config = _fresh_config()
    sizes = read_sizes(asset)
    if sizes is not None:
        apply_sizes(chat.config, sizes)
    spk = asset / SPK_STAT_FILE
    if spk.is_file():
        chat.config.spk_stat = spk.read_text().strip()
    paths = {k: str(Path(root) / v) for k, v in asdict(chat.config.path).items()}
    try:
        ok = chat._load(device=torch.device("cpu"), compile=False, **paths)
    except Exception as exc:  # torch/safetensors/transformers raise many types on bad weights
        raise WeightsError(f"ChatTTS could not load the weights in {root}: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not ok:
        raise WeightsError(f"ChatTTS reported an incomplete load of {root}")
    if check_tokenizer:
        check_tokenizer_ids(chat.tokenizer._tokenizer, root)
    return chat


def check_tokenizer_ids(tok: Any, where: Path | str) -> None:
    """Raise :class:`WeightsError` unless ``tok`` has ChatTTS' vocabulary size and special ids."""
    n = len(tok)
    if n != contract.TEXT_VOCAB_SIZE:
        raise WeightsError(f"tokenizer in {where} has {n} tokens; ChatTTS needs {contract.TEXT_VOCAB_SIZE}")
    for token, want in contract.SPECIAL_TOKEN_IDS.items():
        got = tok.convert_tokens_to_ids(token)
        if got != want:
            raise WeightsError(f"tokenizer in {where}: {token} has id {got}, ChatTTS uses {want}")


def download(dest: Path) -> Path:
    """Fetch 2Noise/ChatTTS with ChatTTS' own downloader (Hugging Face) into ``dest``.

    Returns the snapshot directory (holding ``asset/``).

    Raises:
        WeightsError: with one line, when Hugging Face cannot be reached or the download fails.
    """
    import ChatTTS

    dest.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "20")
    chat = ChatTTS.Chat(logging.getLogger("chattts_serving.chattts"))
    quiet = logging.getLogger("chattts_serving.chattts")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        path = chat.download_models(source="huggingface", custom_path=str(dest))
    except Exception as exc:  # network stacks raise many types
        raise WeightsError(f"download from Hugging Face failed: {type(exc).__name__}: {exc}") from None
    finally:
        quiet.setLevel(level)
    if path is None:
        raise WeightsError("download from Hugging Face (2Noise/ChatTTS) failed: the hub is not reachable "
                           "from this machine; use --assets DIR with a local snapshot, or --synthetic")
    return Path(path)


# --------------------------------------------------------------------------------------
# Generated checkpoints
# --------------------------------------------------------------------------------------
def _vocab() -> Iterator[str]:
    """A 21128-entry WordPiece vocabulary laid out like bert-base-chinese.

    [PAD]=0, [unused1..99], [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103, then printable ASCII,
    common full-width punctuation, WordPiece continuations of letters and digits, and CJK
    unified ideographs from U+4E00 until the vocabulary is full.
    """
    yield "[PAD]"
    for i in range(1, 100):
        yield f"[unused{i}]"
    yield from ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
    ascii_tokens = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    yield from ascii_tokens
    yield from "，。！？、；：“”‘’（）《》【】…—～·「」『』"
    yield from (f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789")
    cjk = 0x4E00
    while True:
        yield chr(cjk)
        cjk += 1


def generate_tokenizer(out_dir: Path) -> None:
    """Write a BertTokenizerFast compatible with ChatTTS' (21178 tokens, same special ids)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    vocab: dict[str, int] = {}
    for tok in _vocab():
        if tok not in vocab:
            vocab[tok] = len(vocab)
        if len(vocab) == contract.BERT_VOCAB_SIZE:
            break
    core = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    core.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                 strip_accents=None, lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece(prefix="##")
    tok = BertTokenizerFast(tokenizer_object=core, unk_token="[UNK]", sep_token="[SEP]",
                            pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                            do_lower_case=True)
    tok.add_tokens(list(ADDED_TOKENS), special_tokens=True)
    check_tokenizer_ids(tok, "generated tokenizer")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))


LAYER_SCALE = 0.25
"""Layer scale given to every ConvNeXt block of generated Decoder/DVAE/Vocos weights.

ChatTTS' random init uses 1e-6 (Decoder/DVAE), which makes the blocks near-identity and hides
the vocoder's receptive field (about +-52 tokens with a realistic layer scale, docs/streaming-quality.md);
trained values are of order 0.1 to 1, so generated weights use a realistic 0.25.
"""


def generate_checkpoint(root: Path, size: str, seed: int) -> Path:
    """Write seeded random weights of ChatTTS' architecture in the published layout.

    The modules are ChatTTS' and Vocos' own classes (``ChatTTS.model.DVAE``, ``Embed``,
    ``vocos.Vocos``, ``transformers.LlamaModel``) at the sizes of ``SIZES[size]``, seeded with
    ``seed``, so that the same (size, seed) always gives the same bytes.

    Returns:
        ``root`` (holding ``asset/``).

    Raises:
        WeightsError: unknown size.
    """
    import numpy as np
    import pybase16384 as b14
    import torch
    from ChatTTS.model import DVAE, Embed
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    if size not in SIZES:
        raise WeightsError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    sizes = SIZES[size]
    cfg = _fresh_config()
    apply_sizes(cfg, sizes)
    root = Path(root)
    asset = root / "asset"
    if asset.exists():
        shutil.rmtree(asset)
    (asset / "gpt").mkdir(parents=True)
    torch.manual_seed(seed)
    np_rng = np.random.default_rng(seed)

    def save(module: torch.nn.Module, name: str) -> None:
        state = {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}
        save_file(state, str(asset / name))

    def realistic_layer_scale(module: torch.nn.Module) -> None:
        from ChatTTS.model.dvae import ConvNeXtBlock as ChatBlock
        from vocos.modules import ConvNeXtBlock as VocosBlock

        with torch.no_grad():
            for m in module.modules():
                if isinstance(m, ChatBlock) and m.weight is not None:
                    m.weight.fill_(LAYER_SCALE)
                elif isinstance(m, VocosBlock) and m.gamma is not None:
                    m.gamma.fill_(LAYER_SCALE)

    llama_kwargs: dict[str, Any] = dict(
        hidden_size=sizes.hidden, intermediate_size=sizes.ffn, num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.heads, num_hidden_layers=sizes.gpt_layers, max_position_embeddings=4096,
        vocab_size=8, rope_theta=10000.0, rms_norm_eps=1e-6, attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False)
    llama_cfg = LlamaConfig(**llama_kwargs)
    gpt = LlamaModel(llama_cfg).eval()
    gpt.save_pretrained(str(asset / "gpt"), safe_serialization=True)

    embed = Embed(sizes.hidden, contract.NUM_AUDIO_TOKENS, contract.TEXT_VOCAB_SIZE, contract.NUM_VQ)
    with torch.no_grad():
        for e in [*embed.emb_code, embed.emb_text]:
            e.weight.normal_(0.0, 0.3)
    save(embed, "Embed.safetensors")

    dvae = DVAE(decoder_config=asdict(cfg.dvae.decoder), encoder_config=asdict(cfg.dvae.encoder),
                vq_config=asdict(cfg.dvae.vq), dim=cfg.dvae.decoder.idim)
    realistic_layer_scale(dvae)
    save(dvae, "DVAE.safetensors")

    decoder = DVAE(decoder_config=asdict(cfg.decoder), dim=cfg.decoder.idim)
    realistic_layer_scale(decoder)
    save(decoder, "Decoder.safetensors")

    vocos = Vocos(feature_extractor=instantiate_class((), asdict(cfg.vocos.feature_extractor)),
                  backbone=instantiate_class((), asdict(cfg.vocos.backbone)),
                  head=instantiate_class((), asdict(cfg.vocos.head)))
    realistic_layer_scale(vocos)
    with torch.no_grad():
        # Speech-like level: log-magnitudes around 1 (|S| ~ 2.7, waveform std ~ 0.1) instead of exp(N(0, 1)).
        head_out = vocos.head.out
        n_mag = head_out.out_features // 2
        head_out.bias[:n_mag].fill_(1.0)
        head_out.weight[:n_mag].mul_(0.5)
    save(vocos, "Vocos.safetensors")

    generate_tokenizer(asset / "tokenizer")

    if sizes.hidden != 768:
        std = np.abs(np_rng.normal(0.0, 1.0, sizes.hidden)).astype(np.float16) + np.float16(0.05)
        mean = np_rng.normal(0.0, 0.5, sizes.hidden).astype(np.float16)
        stat = np.concatenate([std, mean]).astype(np.float16)
        (asset / SPK_STAT_FILE).write_text(b14.encode_to_string(stat.tobytes()))
    (asset / SIZES_FILE).write_text(json.dumps({"generator": "chattts_serving synthetic", "seed": seed,
                                                "sizes": asdict(sizes)}, indent=2))
    return root
