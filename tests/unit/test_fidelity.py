"""The served path computes what ChatTTS computes: our front end (normalisation, prompt, voice
seed), the engine at a greedy temperature and the hidden-state vocoder over the whole
utterance in one window give the waveform of ChatTTS' ``Chat._infer_code`` +
``Chat._decode_to_wavs`` for the same text and speaker (``torch.manual_seed(seed)`` +
``sample_random_speaker``), on the small generated checkpoint.

``Chat.infer`` itself returns that waveform with every sample of magnitude <= 1e-5 deleted
(``ChatTTS/core.py``); the server does not delete samples (docs/requests.md, "Fidelity"), so the
reference here is taken before that step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_serving import contract
from chattts_serving.params import SamplingParams
from chattts_serving.runtime import Artifacts
from chattts_serving.serving.job import SynthesisJob
from chattts_serving.serving.pipeline import offline_audio
from chattts_serving.serving.profile import load_profile
from chattts_serving.serving.request import EntryRequest
from tests.support.inprocess import InProcessStages

GREEDY = 1e-6  # at 1e-4 a near-tie (logit gap about 1e-4) is still a coin toss between implementations
TOKENS = 24


@pytest.fixture(scope="module")
def stages(small_artifacts: Artifacts) -> InProcessStages:
    return InProcessStages(small_artifacts)


@pytest.mark.parametrize("text, voice", [("今天天气很好，我们一起去公园散步吧。", 7),
                                          ("The weather is lovely today, let us take a walk.", 11)])
def test_served_audio_equals_chattts_for_the_same_text_and_voice_seed(small_chat, stages: InProcessStages,
                                                                      text: str, voice: int) -> None:
    chat = small_chat
    params = SamplingParams(temperature=GREEDY, max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    req = EntryRequest(text=text, voice=str(voice), params=params)
    job = SynthesisJob(req=req, schedule=load_profile("cpu").stream.schedule(), emit_tokens=8, arrival_s=0.0)
    ours, result = offline_audio(job, stages)
    (normalized,) = result.normalized_text
    assert chat.normalizer(text, True, True) == normalized  # ChatTTS reads the same text

    torch.manual_seed(voice)
    spk = chat.sample_random_speaker()
    code_params = chat.InferCodeParams(spk_emb=spk, temperature=GREEDY, manual_seed=0, max_new_token=TOKENS,
                                       min_new_token=TOKENS, show_tqdm=False)
    generated = next(chat._infer_code([normalized], False, torch.device("cpu"), True, code_params))
    ref = np.asarray(chat._decode_to_wavs(generated.hiddens, True))[0]

    assert ours.size == ref.size == contract.samples_for_tokens(TOKENS)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6)  # measured: 1.9e-7 and 2.0e-7 (peaks 0.18, 0.21)
