"""``python -m chattts_serving.gateway``: serve the OpenAI-compatible speech endpoint.

Exit status 2 on usage errors. The API key is read from ``$CHATTTS_API_KEY`` only (never from
the command line, where other users of the host could read it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .settings import ENV_API_KEY, GatewaySettings

PROG = "python -m chattts_serving.gateway"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="OpenAI-compatible /v1/audio/speech in front of Triton "
                                f"(set {ENV_API_KEY} to require a bearer key).")
    p.add_argument("--triton-url", default=None, help="Triton gRPC host:port (default $CHATTTS_TRITON_URL or "
                   "127.0.0.1:8001)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on (default 8080)")
    p.add_argument("--max-input-chars", type=int, default=None, help="longest input in characters (default 4096)")
    p.add_argument("--stream-timeout-s", type=float, default=None, help="deadline of one synthesis, s (default 300)")
    p.add_argument("--max-streams", type=int, default=None, help="streams relayed at once (default 64)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = GatewaySettings.from_env(triton_url=args.triton_url, max_input_chars=args.max_input_chars,
                                            stream_timeout_s=args.stream_timeout_s, max_streams=args.max_streams)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import create_app

    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
