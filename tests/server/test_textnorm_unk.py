"""Nothing unreadable reaches the GPT silently, through a real tritonserver: a character the
loaded tokenizer would turn into [UNK] is left out of the prompt and reported in info.dropped
and by the CLI. The front end's part in process: tests/unit/test_textnorm_unk.py.

The generated tokenizer has bert-base-chinese's layout but its Chinese characters run from
U+4E00 to U+9F9E, so 龟 (U+9F9F, in the real vocabulary) is [UNK] there and none of ChatTTS'
homophones replaces it: it stands for any character the loaded vocabulary lacks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MISSING = "龟"
"""In the generated tokenizer's vocabulary range gap (see the module docstring)."""


def test_server_reports_what_the_tokenizer_lacks_in_info_and_cli(triton_server: Any, tmp_path: Path) -> None:
    from chattts_serving.client import SynthesisRequest, synthesize_stream

    text = f"乌{MISSING}爬得很慢😀。"
    result = synthesize_stream(triton_server.grpc_url, SynthesisRequest(text=text, seed=3, max_new_tokens=8),
                               timeout_s=60)
    assert result.info["dropped"] == [MISSING, "😀"]
    assert result.info["normalized_text"] == ["乌爬得很慢。"]
    assert np.asarray(result.audio).size > 0
    cli = [sys.executable, "-m", "chattts_serving.client", "--url", triton_server.grpc_url, "--text", text,
           "--max-new-tokens", "8", "--out", str(tmp_path / "out.wav")]
    proc = subprocess.run([*cli, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dropped"] == [MISSING, "😀"]
    proc = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"not spoken: {MISSING} 😀" in proc.stdout + proc.stderr
