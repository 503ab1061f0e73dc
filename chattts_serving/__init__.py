"""ChatTTS served from NVIDIA Triton: streaming text-to-speech at scale.

The folders follow a request's data, and imports point one way, from the top of this list to
the bottom (``tests/unit/test_layout.py`` checks it):

* ``contract``, ``errors``, ``params``, ``runtime``: the base. Tensor names, dtypes, model
  names, the sample rate and the enumerations; error kinds and their codec (kind -> Triton
  code, message tag, gRPC and HTTP status); sampling parameters; the exported artifacts and
  ONNX Runtime sessions.
* ``text/``: text to prompt. Normalisation, sentence segments, the front end (prompt ids),
  refine-text prompts, voices and speaker vectors.
* ``engine/``: the GPT engine. In-flight batching with the KV cache resident
  (``scheduler``), ChatTTS' sampler, the GPT step runner.
* ``audio/``: tokens to sound. The chunk schedule of a stream, the vocoder runners, output
  formats (WAV, MP3, ...).
* ``serving/``: the entry models' logic, free of Triton. Request parsing (``request``), the
  pipeline over the three stages (``pipeline``), admission, the stream lifecycle, circuit
  breakers and degradation, the entry service, profiles and JSON logs.
* ``triton/``: the Triton adapters. One class per model (``models``; each
  ``model_repository/*/1/model.py`` subclasses one), BLS stages, responses, metrics, the
  engine's cancel socket (``cancels``).
* ``client/``, ``gateway/``, ``export/``, ``deploy/`` (repository renderer, server launcher,
  probe), ``bench/``, ``demo``: the applications around it.
"""
