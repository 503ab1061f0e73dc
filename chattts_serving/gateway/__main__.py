"""``python -m chattts_serving.gateway``: serve the OpenAI-compatible speech endpoint.

Every knob is a flag and an environment variable (:data:`.settings.OPTIONS`; the flag wins).
Exit status 2 on usage errors. The API key is read from ``$CHATTTS_API_KEY`` only (never from
the command line, where other users of the host could read it). SIGTERM or SIGINT drains the
gateway (:mod:`.drain`) and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .settings import ENV_API_KEY, OPTIONS, GatewaySettings

PROG = "python -m chattts_serving.gateway"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: ``--host``, ``--port``, ``--log-level`` and one flag per knob of
    :data:`OPTIONS` (kept as text: None when not given)."""
    p = argparse.ArgumentParser(prog=PROG, description="OpenAI-compatible /v1/audio/speech in front of Triton "
                                f"(set {ENV_API_KEY} to require a bearer key).")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on (default 8080)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    for opt in OPTIONS:
        p.add_argument(opt.flag, dest=opt.field, default=None, metavar=opt.field.upper(),
                       help=f"{opt.help}; env {opt.env}")
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """:meth:`GatewaySettings.from_env` with the flags that were given on top (parsed by the
    settings' fields, as the variables are).

    Raises ValueError naming the flag or variable whose value is wrong."""
    flags = {opt.field: getattr(args, opt.field) for opt in OPTIONS if getattr(args, opt.field) is not None}
    return GatewaySettings.load(None, flags)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from .app import create_app

    try:
        app = create_app(settings_from_args(args))
    except ValueError as exc:  # a bad flag or variable, or a malformed voices file (VoiceError)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .drain import EXIT_GRACE_S, DrainingServer

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=EXIT_GRACE_S)
    state = app.state.gateway
    server = DrainingServer(config, state.drain, state.settings.drain_timeout_s)
    server.run()  # SIGTERM/SIGINT: the drain (drain.py), then uvicorn's shutdown
    return 0 if server.started else 3  # 3: uvicorn's STARTUP_FAILURE


if __name__ == "__main__":
    sys.exit(main())
