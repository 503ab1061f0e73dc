"""chattts_frontend: text (BYTES [1]) + voice, refine_prompt (BYTES [1]) and refined_ids
(INT32 [N], the refine stage's output), all optional -> input_ids (INT32 [T]), spk_emb (FP32
[H], L2-normalised), normalized_text (BYTES [1]), dropped (BYTES [1], JSON list of what is not
spoken), refine_ids (INT32 [T'], the refine-text prompt). Logic: chattts_serving.frontend."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from chattts_serving import contract
from chattts_serving import triton_glue as glue
from chattts_serving.frontend import FrontEnd, FrontendError
from chattts_serving.pipeline import RequestError, string_input


class TritonPythonModel:
    def initialize(self, args):
        setup = glue.ModelSetup.from_args(pb_utils, args, decoupled=False)
        fp = setup.profile.frontend
        self.frontend = FrontEnd(setup.artifacts, fp.max_text_chars, fp.default_voice_seed, wetext=fp.wetext)
        # warm-up: number readers, normaliser JIT, tokenizer, voice (and the wetext library when on)
        self.frontend.prepare("你好，世界。Hello 123, 2024-03-05.", "")

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            inputs = glue.request_inputs(pb_utils, request, contract.FRONTEND_INPUTS)
            text = string_input(inputs, contract.IN_TEXT.name, required=True)
            voice = string_input(inputs, contract.IN_VOICE.name, required=False) or ""
            prompt = string_input(inputs, contract.IN_REFINE_PROMPT.name, required=False)  # None: no refine
            refined = inputs.get(contract.FE_REFINED_IDS.name)
            try:
                p = self.frontend.prepare(text, voice, prompt, refined)
            except FrontendError as exc:
                raise RequestError(str(exc)) from None
        except RequestError as exc:
            return pb_utils.InferenceResponse(error=glue.triton_error(pb_utils, exc, tag_kind=True))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(contract.FE_INPUT_IDS.name, p.input_ids),
            pb_utils.Tensor(contract.FE_SPK_EMB.name, p.spk_emb.astype(np.float32)),
            glue.string_tensor(pb_utils, contract.FE_NORMALIZED.name, p.normalized),
            glue.string_tensor(pb_utils, contract.FE_DROPPED.name, json.dumps(list(p.dropped), ensure_ascii=False)),
            pb_utils.Tensor(contract.FE_REFINE_IDS.name,
                            p.refine_ids if p.refine_ids is not None else np.zeros(0, np.int32))])
