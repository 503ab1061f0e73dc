"""Every Triton model's tensors (:class:`~chattts_serving.contract.specs.TensorSpec`): the entry
points, the front end, the GPT engine and its ensemble mode, the vocoders, the ensemble door and
the admission watch; the keys of the ``info`` output."""

from __future__ import annotations

from typing import Final

from .specs import REFINE_PARAMS, REFINE_PREFIX, SAMPLING_PARAMS, STREAM_PARAMS, TensorSpec
from .units import NUM_VQ

# priorities: the ``priority`` input of the entry points (:class:`Priority`; "priority" itself
# is a reserved Triton request-parameter name, and Python models cannot read Triton's request
# priority)

# entry-point inputs (models chattts and chattts_offline, max_batch_size 0)
IN_TEXT: Final = TensorSpec("text", "TYPE_STRING", (1,), doc="UTF-8 text, Chinese and/or English")
IN_VOICE: Final = TensorSpec("voice", "TYPE_STRING", (1,), optional=True,
                             doc="speaker: integer seed, ChatTTS spk_emb string, or empty for the default")
IN_VOCODER: Final = TensorSpec("vocoder", "TYPE_STRING", (1,), optional=True,
                               doc="'hidden' (Decoder, ChatTTS' default) or 'codes' (DVAE)")
IN_PRIORITY: Final = TensorSpec("priority", "TYPE_STRING", (1,), optional=True,
                                doc="'realtime' (default) or 'batch': realtime requests are scheduled first")
IN_TIMEOUT: Final = TensorSpec("timeout_s", "TYPE_FP32", (1,), optional=True,
                               doc="deadline for the whole request in seconds, (0, 3600]; expiry ends it with an error")
IN_REFINE_TEXT: Final = TensorSpec("refine_text", "TYPE_BOOL", (1,), optional=True,
                                   doc="run ChatTTS' refine-text stage first (pauses, laughs, fillers); default false")
IN_REFINE_PROMPT: Final = TensorSpec("refine_prompt", "TYPE_STRING", (1,), optional=True,
                                     doc="control tokens for refine-text, e.g. '[oral_2][laugh_0][break_6]'")
IN_SEGMENTATION: Final = TensorSpec("segmentation", "TYPE_STRING", (1,), optional=True,
                                    doc="'streaming' (sentence segments, lowest TTFA) or 'chattts' (ChatTTS' split and "
                                        "first-piece audio prompt); default: the profile's frontend.segmentation")
IN_LANGUAGE: Final = TensorSpec("language", "TYPE_STRING", (1,), optional=True,
                                doc="'auto' (default), 'zh' or 'en': the language numbers, units and symbols are read "
                                    "in where the text around them does not say")
IN_REFERENCE_AUDIO: Final = TensorSpec("reference_audio", "TYPE_FP32", (-1,), optional=True,
                                       doc="reference recording: mono samples in [-1, 1] at reference_sample_rate_hz, "
                                           "the voice to speak with (ChatTTS' spk_smp, encoded by the DVAE encoder)")
IN_REFERENCE_RATE: Final = TensorSpec("reference_sample_rate_hz", "TYPE_INT32", (1,), optional=True,
                                      doc="sample rate of reference_audio in Hz (default 24000; others are resampled)")
IN_REFERENCE_TEXT: Final = TensorSpec("reference_text", "TYPE_STRING", (1,), optional=True,
                                      doc="transcript of reference_audio or spk_smp (ChatTTS' txt_smp); required with "
                                          "either")
IN_SPK_SMP: Final = TensorSpec("spk_smp", "TYPE_STRING", (1,), optional=True,
                               doc="a ChatTTS audio-prompt string (Chat.sample_audio_speaker), instead of "
                                   "reference_audio")
IN_VALIDATE_ONLY: Final = TensorSpec("validate_only", "TYPE_BOOL", (1,), optional=True,
                                     doc="check the request whole (parameters, voice, reference, refine prompt) and "
                                         "end with the final info and no audio: nothing is generated")
ENTRY_INPUTS: Final = (IN_TEXT, IN_VOICE, IN_VOCODER, IN_PRIORITY, IN_TIMEOUT,
                       *(p.tensor() for p in SAMPLING_PARAMS), *(p.tensor() for p in STREAM_PARAMS),
                       IN_REFINE_TEXT, IN_REFINE_PROMPT,
                       *(TensorSpec(REFINE_PREFIX + p.name, p.triton_dtype, (1,), optional=True, doc=p.doc)
                         for p in REFINE_PARAMS),
                       IN_SEGMENTATION, IN_REFERENCE_AUDIO, IN_REFERENCE_RATE, IN_REFERENCE_TEXT, IN_SPK_SMP,
                       IN_LANGUAGE, IN_VALIDATE_ONLY)
OUT_AUDIO: Final = TensorSpec("audio", "TYPE_FP32", (-1,),
                              doc="mono waveform samples at SAMPLE_RATE_HZ, float32 in [-1, 1]")
OUT_INFO: Final = TensorSpec("info", "TYPE_STRING", (1,),
                             doc="JSON object about the request (see INFO_HEADER_KEYS, INFO_FINAL_KEYS)")
ENTRY_OUTPUTS: Final = (OUT_AUDIO, OUT_INFO)
ADM_FULL: Final = TensorSpec("full", "TYPE_BOOL", (-1,),
                             doc="per door of ADMISSION_DOORS: every slot taken, a request now is refused busy")
"""The admission watch's one output (no inputs); its name is also written in gate/watch.cc."""
INFO_HEADER_KEYS: Final = ("request_id", "sample_rate_hz", "normalized_text", "dropped", "segments", "vocoder",
                           "refined", "degraded", "segmentation", "reference", "segment_starts", "final")
"""Keys of ``info`` on a stream's first audio response: the request id (the client's Triton
request id, or one generated by the server), 24000, the text after normalisation (one string
per sentence segment; after refine-text, the refined text the code stage spoke), the characters
or reserved tokens that were not spoken (never dropped silently), the number of segments, the
vocoder path, whether refine-text ran, whether the server ran the request in its degraded mode
(which skips refine-text), the segmentation (:class:`Segmentation`), where the audio prompt
came from (:data:`REFERENCE_SOURCES`), ``segment_starts`` (the sample offset at SAMPLE_RATE_HZ where
each segment's audio begins, so far; the first chunk of every later segment carries an ``info``
of only ``{"segment_starts": [...]}``, the list grown by one: where sentences start in the audio,
as it streams), and ``final`` false. Triton 2.51's Python backend cannot set response
parameters (docs/triton-workarounds.md, "no response parameters"), so this travels as an
output; the client's request id also comes back in every
response's ``id`` field (Triton's own)."""
INFO_FINAL_KEYS: Final = (*INFO_HEADER_KEYS, "audio_s", "chunks", "tokens", "capped_segments", "stop_reason")
"""Keys of ``info`` on the final response (streaming) or the only one (offline): the header's
keys with ``final`` true, plus seconds of audio sent, audio chunks, GPT tokens, the indices of
segments that hit max_new_tokens (their sentence may be cut short) and the last stop reason."""

REFERENCE_SOURCES: Final = ("", "recording", "spk_smp", "voice", "first_piece")
"""``info.reference``: no audio prompt; the request's reference_audio; its spk_smp; the
recording of a voice from the voices file; the first piece's own audio (``chattts``
segmentation, more than one piece, no other reference)."""

# front end
FE_INPUT_IDS: Final = TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True, doc="prompt token ids (T,)")
FE_SPK_EMB: Final = TensorSpec("spk_emb", "TYPE_FP32", (-1,),
                               doc="L2-normalised speaker vector (H,); empty (0,) without one ([empty_spk] prompt)")
FE_NORMALIZED: Final = TensorSpec("normalized_text", "TYPE_STRING", (1,), doc="text after normalisation")
FE_DROPPED: Final = TensorSpec("dropped", "TYPE_STRING", (1,),
                               doc="JSON list of the characters or reserved tokens that are not spoken")
FE_REFINE_IDS: Final = TensorSpec("refine_ids", "TYPE_INT32", (-1,),
                                  doc="refine-text prompt ids [Sbreak]{normalized}[Pbreak]{refine_prompt} (T,)")
FE_REFINED_IDS: Final = TensorSpec("refined_ids", "TYPE_INT32", (-1,), optional=True,
                                   doc="text ids the refine stage generated (N,): the code prompt is built from them")
FE_NO_SPEAKER: Final = TensorSpec("no_speaker", "TYPE_BOOL", (1,), optional=True,
                                  doc="true: no speaker vector, [empty_spk] in the prompt (a reference recording "
                                      "alone)")
FE_KEEP_UNSPEAKABLE: Final = TensorSpec("keep_unspeakable", "TYPE_BOOL", (1,), optional=True,
                                        doc="true: a piece of ChatTTS' split, prompted even when nothing in it can be "
                                            "spoken (a blank line, a lone 。), as ChatTTS does")
FE_TRANSIENT_REFERENCE: Final = TensorSpec("transient_reference", "TYPE_BOOL", (1,), optional=True,
                                           doc="true: reference_audio is used once (the first piece's own audio): "
                                               "encoded without the recording checks and not cached")
FE_PROMPT_CODES: Final = TensorSpec("prompt_codes", "TYPE_INT32", (-1, NUM_VQ),
                                    doc="audio-prompt codes (P, 4) of reference_audio or of the voice's recording; "
                                        "(0, 4) for none")
FE_REQUEST_TEXT: Final = TensorSpec("request_text", "TYPE_STRING", (1,), optional=True,
                                   doc="the ensemble door's whole request (its 'text'; the other entry inputs under "
                                       "their own names): validated like chattts' and prepared for the engine's "
                                       "ensemble mode; without it the call is one segment of a BLS pipeline")
FRONTEND_REQUEST_INPUTS: Final = tuple(t for t in ENTRY_INPUTS if t.name not in
                                       {IN_TEXT.name, IN_VOICE.name, IN_REFINE_PROMPT.name, IN_REFERENCE_TEXT.name,
                                        IN_REFERENCE_AUDIO.name, IN_REFERENCE_RATE.name, IN_VALIDATE_ONLY.name})
"""The entry inputs the front end takes only for an ensemble request (the others it takes anyway)."""
FE_TEXT: Final = TensorSpec(IN_TEXT.name, IN_TEXT.triton_dtype, IN_TEXT.dims, optional=True,
                            doc="one segment's text (required, unless the call has request_text or segments)")
# A whole request in one call: one call to chattts_frontend prepares every segment of a
# request; a later call (refine-text's code prompts, ChatTTS' first-piece audio prompt) prompts
# the texts it made again without normalising them. A call with the single-segment ``text`` is
# unchanged: for it every output below describes that one segment.
FE_SEGMENTS: Final = TensorSpec("segments", "TYPE_STRING", (-1,), optional=True,
                                doc="the request's segment texts (N,), in order, each normalised and prompted "
                                    "(instead of text)")
FE_SEGMENT_SPEEDS: Final = TensorSpec("segment_speeds", "TYPE_INT32", (-1,), optional=True,
                                      doc="with segments: they are the front end's own segment_texts, prompted again "
                                          "at these speeds (N,) 0..9 without normalising")
FE_REFINED_LENGTHS: Final = TensorSpec("refined_lengths", "TYPE_INT32", (-1,), optional=True,
                                       doc="how many of refined_ids belong to each segment (N,), in order; 0: not "
                                           "refined")
FE_INPUT_LENGTHS: Final = TensorSpec("input_lengths", "TYPE_INT32", (-1,),
                                     doc="how many of input_ids (every segment's, concatenated) are each "
                                         "segment's (N,)")
FE_REFINE_LENGTHS: Final = TensorSpec("refine_lengths", "TYPE_INT32", (-1,),
                                      doc="how many of refine_ids (every segment's, concatenated) are each segment's "
                                          "(N,); 0: none")
FE_SEGMENT_TEXTS: Final = TensorSpec("segment_texts", "TYPE_STRING", (-1,),
                                     doc="each segment's text after normalisation (or refinement) (N,); "
                                         "normalized_text joins them")
FE_SEGMENT_DROPPED: Final = TensorSpec("segment_dropped", "TYPE_STRING", (-1,),
                                       doc="each segment's JSON list of what is not spoken (N,); dropped merges them")
FE_PROMPT_SPEEDS: Final = TensorSpec("prompt_speeds", "TYPE_INT32", (-1,),
                                     doc="N of each segment's [speed_N] (N,)")
FRONTEND_INPUTS: Final = (FE_TEXT, IN_VOICE, IN_REFINE_PROMPT, FE_REFINED_IDS, IN_REFERENCE_TEXT, IN_REFERENCE_AUDIO,
                          IN_REFERENCE_RATE, FE_NO_SPEAKER, FE_KEEP_UNSPEAKABLE, FE_TRANSIENT_REFERENCE,
                          FE_REQUEST_TEXT, *FRONTEND_REQUEST_INPUTS, FE_SEGMENTS, FE_SEGMENT_SPEEDS,
                          FE_REFINED_LENGTHS)
FE_STREAM_ID: Final = TensorSpec("stream_id", "TYPE_STRING", (1,),
                                 doc="ensemble request: the engine sequence's handle (a fresh UUID hex)")
FE_ENGINE_PRIORITY: Final = TensorSpec("engine_priority", "TYPE_INT32", (1,),
                                       doc="ensemble request: the engine's scheduling class (0 realtime, 1 batch)")
FE_TIMEOUT_MS: Final = TensorSpec("timeout_ms", "TYPE_INT64", (1,),
                                  doc="ensemble request: what is left of timeout_s in ms (0: no deadline)")
FE_LOOKAHEAD: Final = TensorSpec("window_lookahead_tokens", "TYPE_INT32", (1,),
                                 doc="ensemble request: the request's lookahead_tokens (-1: the profile's schedule)")
FE_INFO: Final = TensorSpec("info_header", "TYPE_STRING", (1,),
                            doc="ensemble request: info JSON of the stream's first chunk (INFO_HEADER_KEYS)")
FRONTEND_REQUEST_OUTPUTS: Final = (FE_STREAM_ID, FE_ENGINE_PRIORITY, FE_TIMEOUT_MS, FE_LOOKAHEAD, FE_INFO)
FRONTEND_OUTPUTS: Final = (FE_INPUT_IDS, FE_SPK_EMB, FE_NORMALIZED, FE_DROPPED, FE_REFINE_IDS, FE_PROMPT_CODES,
                           *FRONTEND_REQUEST_OUTPUTS, FE_INPUT_LENGTHS, FE_REFINE_LENGTHS, FE_SEGMENT_TEXTS,
                           FE_SEGMENT_DROPPED, FE_PROMPT_SPEEDS)

# GPT engine (decoupled)
EN_EMIT_TOKENS: Final = TensorSpec("emit_tokens", "TYPE_INT32", (1,), optional=True,
                                   doc="tokens per streamed response (default 1)")
EN_EMIT_AT: Final = TensorSpec("emit_at_tokens", "TYPE_INT32", (-1,), optional=True,
                               doc="also send a response when exactly one of these many tokens exist (ascending: "
                                   "a stream's vocoder windows' ready points)")
EN_STREAM_ID: Final = TensorSpec("stream_id", "TYPE_STRING", (1,), optional=True,
                                 doc="caller's handle for this sequence, used by a later cancel request")
EN_CONTROL: Final = TensorSpec("control", "TYPE_STRING", (1,), optional=True,
                               doc="'cancel': end the live sequence named by stream_id (no other inputs)")
EN_PRIORITY: Final = TensorSpec("priority", "TYPE_INT32", (1,), optional=True,
                                doc="scheduling class: 0 realtime (admitted first), 1 batch")
EN_TIMEOUT_MS: Final = TensorSpec("timeout_ms", "TYPE_INT64", (1,), optional=True,
                                  doc="the sequence ends with an error this many ms after submission")
EN_MODE: Final = TensorSpec("mode", "TYPE_STRING", (1,), optional=True,
                            doc="'code' (speech codes, default) or 'text' (refine-text: no spk_emb; sampling inputs "
                                "take REFINE_PARAMS' defaults and ranges; codes carry the text id in every column)")
EN_SPK_EMB: Final = TensorSpec("spk_emb", "TYPE_FP32", (-1,), optional=True,
                               doc="L2-normalised speaker vector (H,); none or (0,): [empty_spk] prompt")
EN_PROMPT_CODES: Final = TensorSpec("prompt_codes", "TYPE_INT32", (-1, NUM_VQ), optional=True,
                                    doc="audio-prompt codes (P, 4) in [0, 625) after the text prompt (ChatTTS' "
                                        "spk_smp), (0, 4) for none; code mode only")
EN_DELIVERY_ADDRESS: Final = TensorSpec("delivery_address", "TYPE_STRING", (1,), optional=True,
                                        doc="the caller's receipt socket (Linux abstract namespace): the engine writes "
                                            "stream_id there after each response it sent "
                                            "(chattts_serving.triton.compat.receipts)")
EN_WINDOW_LOOKAHEAD: Final = TensorSpec(FE_LOOKAHEAD.name, "TYPE_INT32", (1,), optional=True,
                                        doc="ensemble mode (the ensemble door): respond with vocoder windows of the "
                                            "profile's chunk schedule at this lookahead (-1: the profile's) instead "
                                            "of token batches")
EN_INFO_HEADER: Final = TensorSpec(FE_INFO.name, "TYPE_STRING", (1,), optional=True,
                                   doc="ensemble mode: info JSON for the first window (the last one's is completed "
                                       "with the final keys)")
ENGINE_INPUTS: Final = (FE_INPUT_IDS, EN_SPK_EMB, *(p.tensor() for p in SAMPLING_PARAMS), EN_EMIT_TOKENS,
                        EN_STREAM_ID, EN_CONTROL, EN_PRIORITY, EN_TIMEOUT_MS, EN_EMIT_AT, EN_MODE, EN_PROMPT_CODES,
                        EN_DELIVERY_ADDRESS, EN_WINDOW_LOOKAHEAD, EN_INFO_HEADER)
EN_CODES: Final = TensorSpec("codes", "TYPE_INT32", (-1, NUM_VQ), doc="codes of the new tokens (N, 4)")
EN_HIDDEN: Final = TensorSpec("hidden", "TYPE_FP32", (-1, -1), doc="GPT last hidden state per token (N, H)")
EN_STOP: Final = TensorSpec("stop_reason", "TYPE_STRING", (1,),
                            doc="'' while running, then 'eos', 'max_new_tokens' or 'cancelled'")
# ensemble mode (the ensemble door): a response is a vocoder window, or a progress tick that
# carries only window_stream_id (the ensemble vocoder's chance to see a client's cancel)
WIN_HIDDEN: Final = TensorSpec("window_hidden", "TYPE_FP32", (-1, -1), optional=True,
                               doc="the window's tokens' hidden states (T, H): new tokens with left context and "
                                   "lookahead; (0, H) for an error or an empty last window")
WIN_PLAN: Final = TensorSpec("window_plan", "TYPE_INT32", (3,), optional=True,
                             doc="[chunk index, first sample of the window's audio to keep, samples to keep]")
WIN_INFO: Final = TensorSpec("window_info", "TYPE_STRING", (1,), optional=True,
                             doc="info JSON of the first chunk (INFO_HEADER_KEYS) and of the last (INFO_FINAL_KEYS); "
                                 "'' for the others")
WIN_ERROR: Final = TensorSpec("window_error", "TYPE_STRING", (1,), optional=True,
                              doc="'' or the stream's error ([kind] message): the ensemble vocoder answers it "
                                  "with that error")
WIN_STREAM_ID: Final = TensorSpec("window_stream_id", "TYPE_STRING", (1,), optional=True,
                                  doc="the engine sequence's stream_id (the ensemble vocoder cancels it when the "
                                      "client has gone)")
WIN_REQUEST_ID: Final = TensorSpec("window_request_id", "TYPE_STRING", (1,), optional=True,
                                   doc="the stream's request id (the client's, or the one the front end generated), "
                                       "on every window: for the vocoder step's log lines")
WINDOW_OUTPUTS: Final = (WIN_HIDDEN, WIN_PLAN, WIN_INFO, WIN_ERROR, WIN_STREAM_ID, WIN_REQUEST_ID)
ENGINE_OUTPUTS: Final = (EN_CODES, EN_HIDDEN, EN_STOP, *WINDOW_OUTPUTS)

# vocoders (max_batch_size > 0: dims exclude the batch dimension)
VO_HIDDEN: Final = TensorSpec("hidden", "TYPE_FP32", (-1, -1), doc="token window of GPT hidden states (T, H)")
VO_CODES: Final = TensorSpec("codes", "TYPE_INT32", (-1, NUM_VQ), doc="token window of codes (T, 4)")
VO_AUDIO: Final = TensorSpec("audio", "TYPE_FP32", (-1,), doc="waveform of the window, 512*T-256 samples")
VO_STREAM_ID: Final = TensorSpec("stream_id", "TYPE_STRING", (1,), optional=True,
                                 doc="a carried stream's id (the vocoder keeps its convolution state under it); "
                                     "absent: the window is decoded alone")
VO_STREAM_PLAN: Final = TensorSpec("stream_plan", "TYPE_INT32", (3,), optional=True,
                                   doc="with stream_id: [first token of the window, token to commit (the next "
                                       "window's start), STREAM_* action]; audio then holds the window's complete "
                                       "samples, 512*(T-1) (to the end on STREAM_FINAL; none on STREAM_RELEASE)")
VOCODER_STREAM_INPUTS: Final = (VO_STREAM_ID, VO_STREAM_PLAN)
STREAM_CONTINUE: Final = 0
"""stream_plan action: vocode the window, commit, keep the state."""
STREAM_FINAL: Final = 1
"""stream_plan action: the stream's last window; its state is freed."""
STREAM_RELEASE: Final = 2
"""stream_plan action: free the state without vocoding (an empty window: the stream was cancelled or failed)."""

# the ensemble door: chattts' inputs; audio chunks, each with its index, info on the first and last
OUT_CHUNK_INDEX: Final = TensorSpec("chunk_index", "TYPE_INT32", (1,),
                                    doc="the chunk's index in its stream (0, 1, ...): a client plays chunks in this "
                                        "order (Triton does not promise an ensemble's responses in order)")
ENSEMBLE_INPUTS: Final = tuple(FE_TEXT if t == IN_TEXT else t for t in ENTRY_INPUTS if t != IN_VALIDATE_ONLY)
"""chattts' inputs; ``text`` is optional in the config only because of docs/triton-workarounds.md,
"ensemble: missing required input": the front end refuses it ("missing required input
'text'", as chattts does). ``validate_only`` is not
one of them: the ensemble always synthesises (Triton refuses the input by name)."""
ENSEMBLE_OUTPUTS: Final = (OUT_AUDIO, OUT_CHUNK_INDEX, OUT_INFO)
ENSEMBLE_VOCODER_INPUTS: Final = WINDOW_OUTPUTS
ENSEMBLE_VOCODER_OUTPUTS: Final = ENSEMBLE_OUTPUTS
"""The ensemble's last step answers with the ensemble's own outputs."""
