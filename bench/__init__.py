"""Side-by-side benchmark: upstream ChatTTS served one request at a time vs this Triton server.

``python -m bench`` runs, in one process tree and with one set of weights,
sentences and token budget: the raw ONNX Runtime GPT step (the hardware ceiling), the
synchronous ChatTTS baseline (torch, ``Chat.infer``) and this server at several concurrency
levels of gRPC streaming clients; it writes ``bench.json``, ``bench.md`` and PNG plots. See
:mod:`bench.run` for the command and :mod:`bench.config` for its options.

The package lives at the repository root, outside the installed ``chattts_serving`` (the wheel
does not ship it): it imports ``chattts_serving`` freely and ``chattts_serving`` never imports
it (tests/unit/test_layout.py); run it from a checkout. This module stays light (no torch, no
onnxruntime) so that load-test files can import :func:`load_sentences` cheaply.
"""

from __future__ import annotations

from pathlib import Path

SENTENCES_FILE = Path(__file__).with_name("sentences.txt")
"""Real Chinese sentences of 10 to 50 characters, one per line ('#' lines are comments)."""


def load_sentences(path: Path = SENTENCES_FILE) -> list[str]:
    """The benchmark sentences of ``path``, in file order, blank and comment lines skipped.

    Raises FileNotFoundError if ``path`` is missing and ValueError if it holds no sentence.
    """
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line and not line.startswith("#")]
    if not sentences:
        raise ValueError(f"{path} holds no sentence")
    return sentences
