"""``chattts-serve``: render the model repository for a profile and serve it with the bundled
tritonserver (:class:`~chattts_serving.deploy.server.TritonServer`) under a
:class:`~chattts_serving.deploy.supervisor.Supervisor`, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from ..client.keys import INFERENCE_HEADER, INFERENCE_KEY_ENV, MIN_KEY_CHARS
from ..serving.profile import PROFILES_DIR, ProfileError, load_profile
from .admin import ADMIN_HEADER, RESTRICTED_APIS, TOKEN_ENV, publish
from .render import RenderError, render_repository
from .server import LOOPBACK, ServerError, TritonServer
from .supervisor import supervise


def main(argv: list[str] | None = None) -> int:
    apis = ", ".join(RESTRICTED_APIS)
    ap = argparse.ArgumentParser(prog="chattts-serve", description="Render the model repository and serve it "
                                 f"with the bundled tritonserver until Ctrl-C. The admin APIs ({apis}) need the "
                                 f"header '{ADMIN_HEADER}: ${TOKEN_ENV}'; when {TOKEN_ENV} is unset a token is "
                                 f"generated and printed once on stderr. With ${INFERENCE_KEY_ENV} set, inference "
                                 f"needs the header '{INFERENCE_HEADER}: ${INFERENCE_KEY_ENV}' too. Both are at "
                                 f"least {MIN_KEY_CHARS} characters of printable ASCII without spaces.")
    known = ", ".join(sorted(x.stem for x in PROFILES_DIR.glob("*.toml")))
    ap.add_argument("--profile", default="cpu",
                    help=f"deployment profile: a name under profiles/ ({known}) or a TOML file path "
                         "(default %(default)s)")
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/small"),
                    help="exported model artifacts, a directory with manifest.json (`make export`; "
                         "default %(default)s)")
    ap.add_argument("--repo", type=Path, default=Path("build/model_repository"),
                    help="where the Triton model repository is rendered on each start "
                         "(default %(default)s)")
    ap.add_argument("--address", default=LOOPBACK,
                    help="address the HTTP, gRPC and metrics ports bind (default %(default)s: this host only; "
                         f"0.0.0.0: every interface, then set {INFERENCE_KEY_ENV})")
    ap.add_argument("--http-port", type=int, default=8000,
                    help="Triton's HTTP/REST port: inference, health, admin APIs (default %(default)s)")
    ap.add_argument("--grpc-port", type=int, default=8001,
                    help="Triton's gRPC port: streaming inference, the gateway's --triton-url (default %(default)s)")
    ap.add_argument("--metrics-port", type=int, default=8002,
                    help="Prometheus metrics port, /metrics (default %(default)s)")
    ap.add_argument("--log", type=Path, default=None, help="server log file (default: this terminal)")
    ap.add_argument("--restart-on-failure", action=argparse.BooleanOptionalAction, default=True,
                    help="supervise the server (default): restart it at once when it exits, a model process dies or "
                         "its log shows a crash, and when the deep probe keeps failing (knobs: the profile's [health] "
                         "table); events are JSON lines on stderr")
    args = ap.parse_args(argv)
    if not (args.artifacts / "manifest.json").is_file():
        print(f"chattts-serve: error: no exported artifacts in {args.artifacts} (no manifest.json): run "
              "`make export` or pass --artifacts DIR", file=sys.stderr)
        return 2
    try:
        profile = load_profile(args.profile)
        render_repository(profile, args.artifacts, args.repo)
    except (ProfileError, RenderError, FileNotFoundError) as exc:
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        server = TritonServer(args.repo, http_port=args.http_port, grpc_port=args.grpc_port,
                              metrics_port=args.metrics_port, log_path=args.log, address=args.address)
    except (ValueError, OSError) as exc:  # AdminTokenError, InferenceKeyError
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 2
    if server.admin_token_generated:
        publish("chattts-serve", server.admin_token)

    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM (systemd, docker stop, kill) and SIGINT stop the server like Ctrl-C; a shell
    # starts background jobs with SIGINT ignored, so restore its handler explicitly.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        server.start()
        key = "inference key required" if server.inference_key else "inference open"
        print(f"chattts-serve: ready on {args.address} (HTTP {args.http_port}, gRPC {args.grpc_port}, metrics "
              f"{args.metrics_port}; {key}); Ctrl-C stops", flush=True)
        if args.restart_on_failure:
            supervise(server, profile.health)
            return 0
        assert server.proc is not None
        server.proc.wait()
        return server.proc.returncode if server.proc else 0
    except KeyboardInterrupt:
        print("chattts-serve: stopping", flush=True)
        return 0
    except ServerError as exc:
        print(f"chattts-serve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
