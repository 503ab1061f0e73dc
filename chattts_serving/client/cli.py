"""``chattts-client``: synthesise one text against a running deployment and write a WAV file.

Exit status: 0 on success, 1 when the server refuses or fails the request (or the WAV
cannot be written), 2 on usage errors and when the server cannot be reached, 130 on
Ctrl-C. Errors are one line on stderr, ``chattts-client: error: <message>``, never a
traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import contract
from .common import LOST_CONNECTION, ClientError, SynthesisRequest, SynthesisResult, read_wav, write_wav
from .keys import InferenceKeyError

PROG = "chattts-client"
DEFAULT_URLS = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000", "sse": "127.0.0.1:8000"}
DEFAULT_TIMEOUT_S = 300.0

_PARAM_DOCS = {p.name: p for p in (*contract.SAMPLING_PARAMS, *contract.STREAM_PARAMS)}


def _param_help(name: str) -> str:
    p = _PARAM_DOCS[name]
    return f"{p.doc} (server default {p.default:g})"


def _positive_float(value: str) -> float:
    v = float(value)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return v


def _seed(value: str) -> int:
    v = int(value)
    spec = _PARAM_DOCS["seed"]
    if not spec.low <= v <= spec.high:
        raise argparse.ArgumentTypeError(f"must be in [{int(spec.low)}, {int(spec.high)}], got {value}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (request flags mirror :class:`SynthesisRequest`)."""
    ap = argparse.ArgumentParser(prog=PROG,
                                 description="Synthesise speech with the ChatTTS Triton deployment.")
    ap.add_argument("--url", help="host:port of the server (default 127.0.0.1:8001 for grpc, "
                                  "127.0.0.1:8000 for http and sse)")
    ap.add_argument("--protocol", choices=sorted(DEFAULT_URLS), default="grpc",
                    help=f"grpc: stream from '{contract.MODEL_STREAM}'; http: one '/infer' call to "
                         f"'{contract.MODEL_OFFLINE}'; sse: stream over HTTP generate_stream (default grpc)")
    ap.add_argument("--model", choices=(contract.MODEL_STREAM, contract.MODEL_ENSEMBLE), default=contract.MODEL_STREAM,
                    help=f"grpc and sse: the streaming door, '{contract.MODEL_STREAM}' (BLS, default) or "
                         f"'{contract.MODEL_ENSEMBLE}' (Triton ensemble: one sentence, chunks put in order)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to speak (Chinese and/or English)")
    src.add_argument("--text-file", type=Path, help="UTF-8 file holding the text to speak")
    ap.add_argument("--out", type=Path, default=Path("out.wav"), help="output WAV path (default out.wav)")
    ap.add_argument("--voice", help="speaker: integer seed, a voice name (alloy, nova, ... or from the server's "
                    "voices file) or a ChatTTS spk_emb string (default: the server's)")
    ap.add_argument("--seed", type=_seed, help=_param_help("seed"))
    ap.add_argument("--temperature", type=float, help=_param_help("temperature"))
    ap.add_argument("--top-p", type=float, help=_param_help("top_p"))
    ap.add_argument("--top-k", type=int, help=_param_help("top_k"))
    ap.add_argument("--repetition-penalty", type=float, help=_param_help("repetition_penalty"))
    ap.add_argument("--max-new-tokens", type=int, help=_param_help("max_new_tokens"))
    ap.add_argument("--min-new-tokens", type=int, help=_param_help("min_new_tokens"))
    ap.add_argument("--vocoder", choices=sorted(contract.VOCODER_PATHS),
                    help="'hidden' (Decoder, ChatTTS' default) or 'codes' (DVAE, faster)")
    ap.add_argument("--lookahead-tokens", type=int, help=_param_help("lookahead_tokens"))
    ap.add_argument("--refine-text", action="store_true", default=None,
                    help="run ChatTTS' refine-text stage first (pauses, laughs, fillers)")
    ap.add_argument("--refine-prompt", help="refine-text control tokens, e.g. '[oral_2][laugh_0][break_6]'")
    ap.add_argument("--segmentation", choices=[s.value for s in contract.Segmentation],
                    help="'streaming' (sentence segments, lowest time to first audio) or 'chattts' (ChatTTS' split "
                         "and first-piece audio prompt: one voice across a paragraph) (server default: its profile's)")
    ap.add_argument("--language", choices=[s.value for s in contract.Language],
                    help="the language of numbers, units and symbols the text gives no context for (a bare '25kg'); "
                         "default 'auto': the language with more words in the text")
    ref = ap.add_mutually_exclusive_group()
    ref.add_argument("--reference-audio", type=Path, metavar="FILE.wav",
                     help="speak like this recording (PCM WAV, any rate; mono or averaged to mono): ChatTTS' "
                          "spk_smp; needs --reference-text")
    ref.add_argument("--spk-smp", help="a ChatTTS audio-prompt string (Chat.sample_audio_speaker) instead of "
                                       "--reference-audio; needs --reference-text")
    ap.add_argument("--reference-text", help="the transcript of --reference-audio or --spk-smp (ChatTTS' txt_smp)")
    ap.add_argument("--request-id", help="request id for the server's logs (default: generated by the server)")
    ap.add_argument("--timeout-s", type=_positive_float, default=DEFAULT_TIMEOUT_S,
                    help=f"how long this client waits for the whole response, in seconds (default "
                         f"{DEFAULT_TIMEOUT_S:g}); the server's own deadline is --server-timeout-s")
    ap.add_argument("--server-timeout-s", type=_positive_float,
                    help="the request's timeout_s: the server ends it with an error past this many seconds")
    ap.add_argument("--priority", choices=[p.value for p in contract.Priority],
                    help="scheduling class (server default realtime)")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object (ttfa_s, total_s, audio_s, rtf, chunks, sample_rate_hz)")
    return ap


def _one_line(message: str) -> str:
    return " ".join(message.split()) or "unknown error"


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return code


def _synthesizer(protocol: str, model: str = contract.MODEL_STREAM
                 ) -> Callable[[str, SynthesisRequest, float], SynthesisResult]:
    if protocol == "grpc":
        from .grpc_stream import synthesize_stream
        return lambda url, request, timeout_s: synthesize_stream(url, request, timeout_s, model=model)
    if protocol == "http":
        from .http_infer import synthesize_offline
        return synthesize_offline
    from .sse import synthesize_sse
    return lambda url, request, timeout_s: synthesize_sse(url, request, timeout_s, model=model)


def human_summary(result: SynthesisResult, out: Path) -> str:
    """The result as a few human-readable lines."""
    lines = [f"wrote {out} ({result.audio.size} samples, {result.sample_rate_hz} Hz)",
             f"TTFA {result.ttfa_s * 1000:.1f} ms | total {result.total_s:.3f} s"
             f" | audio {result.audio_s:.3f} s | RTF {result.rtf:.3f} | chunks {result.chunks}"]
    info = result.info
    if info.get("request_id"):
        lines.append(f"request id {info['request_id']}")
    if info.get("dropped"):
        lines.append(f"not spoken: {' '.join(info['dropped'])}")
    if info.get("capped_segments"):
        lines.append(f"sentences cut at max_new_tokens: {info['capped_segments']} (raise --max-new-tokens)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (see the module docstring)."""
    args = build_parser().parse_args(argv)
    if args.text_file is not None:
        try:
            text = args.text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return _fail(f"cannot read --text-file {args.text_file}: {exc}", 2)
    else:
        text = args.text
    audio, rate = None, None
    if args.reference_audio is not None:
        try:
            audio, rate = read_wav(args.reference_audio)
        except ValueError as exc:
            return _fail(f"cannot read --reference-audio {args.reference_audio}: {exc}", 2)
    request = SynthesisRequest(
        text=text, voice=args.voice, seed=args.seed, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, repetition_penalty=args.repetition_penalty, max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens, vocoder=args.vocoder, lookahead_tokens=args.lookahead_tokens,
        refine_text=args.refine_text, refine_prompt=args.refine_prompt, request_id=args.request_id,
        priority=args.priority, timeout_s=args.server_timeout_s, segmentation=args.segmentation,
        reference_audio=audio, reference_sample_rate_hz=rate, reference_text=args.reference_text,
        spk_smp=args.spk_smp, language=args.language)
    if args.model != contract.MODEL_STREAM and args.protocol == "http":
        return _fail(f"--model {args.model} streams: use --protocol grpc or sse", 2)
    url = args.url or DEFAULT_URLS[args.protocol]
    try:
        result = _synthesizer(args.protocol, args.model)(url, request, args.timeout_s)
    except ClientError as exc:
        if exc.connection and exc.message.startswith(LOST_CONNECTION):
            return _fail(f"{exc.message} (the server stopped or restarts: retry)", 2)
        if exc.connection:
            return _fail(f"{exc.message} (protocol {args.protocol}; is the server running?)", 2)
        return _fail(exc.message, 1)
    except InferenceKeyError as exc:  # the configured key is unusable: a usage error, no request sent
        return _fail(str(exc), 2)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # a client-side bug must still not print a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc}", 1)
    try:
        write_wav(args.out, result.audio, result.sample_rate_hz)
    except (OSError, ValueError) as exc:
        return _fail(f"cannot write {args.out}: {exc}", 1)
    if args.json:
        print(result.to_json_str())
    else:
        print(human_summary(result, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
