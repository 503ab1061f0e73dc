"""Side-by-side benchmark: upstream ChatTTS served one request at a time vs this Triton server.

``python -m bench`` runs, in one process tree and with one set of weights,
sentences and token budget: the raw ONNX Runtime GPT step (the hardware ceiling), the
synchronous ChatTTS baseline (torch, ``Chat.infer``) and this server at several concurrency
levels of gRPC streaming clients; it writes ``bench.json``, ``bench.md`` and PNG plots. See
:mod:`bench.run` for the command and :mod:`bench.config` for its options.

The package lives at the repository root, outside the installed ``chattts_serving`` (the wheel
does not ship it): it imports ``chattts_serving`` freely and ``chattts_serving`` never imports
it (tests/unit/test_layout.py); run it from a checkout. Its sentences are the accuracy
measurement's (:mod:`chattts_serving.export.sentences`, re-exported here); this module stays
light (no torch, no onnxruntime) so that load-test files can import :func:`load_sentences` cheaply.
"""

from __future__ import annotations

from chattts_serving.export.sentences import SENTENCES_FILE, load_sentences

__all__ = ["SENTENCES_FILE", "load_sentences"]
