"""The real Chinese sentences the int8 and KV cache accuracies are measured over
(:mod:`.accuracy`), shipped with the package as ``sentences.txt``; the benchmark (``bench/``)
and the load test send the same ones. No import beyond the standard library, so that a load
test can read them cheaply.
"""

from __future__ import annotations

from pathlib import Path

SENTENCES_FILE = Path(__file__).with_name("sentences.txt")
"""Real Chinese sentences of 10 to 50 characters, one per line ('#' lines are comments)."""


def load_sentences(path: Path = SENTENCES_FILE) -> list[str]:
    """The sentences of ``path``, in file order, blank and comment lines skipped.

    Raises FileNotFoundError if ``path`` is missing and ValueError if it holds no sentence.
    """
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line and not line.startswith("#")]
    if not sentences:
        raise ValueError(f"{path} holds no sentence")
    return sentences
