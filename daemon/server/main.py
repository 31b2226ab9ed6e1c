"""`radixd serve`: flags and entry point (`add_arguments(parser)`, `run(args) -> int`).

    radixd serve --host 127.0.0.1 --port 50051 --admin-token "$TOKEN"

Admin (loopback, bearer token) and metrics default to free ports, so replicas on one host need only
distinct `--port`s; the ready line, `server.serving` log and `--ready-file` say where they are."""

from __future__ import annotations

import argparse
import os

from radixd.daemon.engine.config import EngineConfig, add_kv_pool_flags
from radixd.daemon.model.precision import DTYPE_CHOICES, DTYPE_HELP, default_dtype_name
from radixd.daemon.process import log
from radixd.daemon.server.common.state import Limits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `radixd serve`."""
    net = parser.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="public address to bind (default 127.0.0.1)")
    net.add_argument("--port", type=int, default=50051, help="public gRPC port (0 = pick a free one)")
    net.add_argument("--admin-host", default="127.0.0.1", help="admin address (default loopback only)")
    net.add_argument(
        "--admin-port",
        type=int,
        default=0,
        help="admin gRPC port (default 0 = a free one, printed when ready)",
    )
    net.add_argument(
        "--admin-token",
        default=os.environ.get("RADIXD_ADMIN_TOKEN"),
        help="bearer token for the admin service (or RADIXD_ADMIN_TOKEN; generated and logged if unset)",
    )
    net.add_argument("--api-keys", metavar="FILE", help="file of 'KEY TENANT' lines; requires a key per call")
    net.add_argument("--tls-cert", metavar="PEM", help="server certificate chain (enables TLS on both ports)")
    net.add_argument("--tls-key", metavar="PEM", help="server private key")
    net.add_argument(
        "--max-message-mb", type=int, default=16, help="max gRPC message size in MiB (default 16)"
    )
    net.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="Prometheus HTTP port (default 0 = a free one, printed when ready)",
    )
    net.add_argument("--metrics-host", default="127.0.0.1", help="Prometheus address (default loopback)")
    net.add_argument("--no-metrics", action="store_true", help="serve no Prometheus metrics")
    net.add_argument(
        "--ready-file", metavar="PATH", help="write the bound addresses as JSON here once serving"
    )
    model = parser.add_argument_group("model and cache")
    model.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded SmolLM2)")
    model.add_argument("--device", default="cpu", help="cpu or cuda")
    model.add_argument("--dtype", choices=DTYPE_CHOICES, default=default_dtype_name(), help=DTYPE_HELP)
    model.add_argument(
        "--served-model-name",
        default=None,
        help="model name gateways list and route by (vLLM protocol; default: the model file's name)",
    )
    add_kv_pool_flags(model, "KV pool size in blocks (overrides GiB)", blocks_before_gb=False)
    model.add_argument("--no-prefix-cache", action="store_true", help="disable prefix caching")
    # NOTE: the engine's defaults are defined once, in EngineConfig; these flags only expose them.
    engine = EngineConfig()
    sched = parser.add_argument_group("scheduling and limits")
    sched.add_argument(
        "--max-queue",
        type=int,
        default=engine.max_waiting,
        help=f"requests in flight before RESOURCE_EXHAUSTED (default {engine.max_waiting})",
    )
    sched.add_argument("--max-num-seqs", type=int, default=engine.max_num_seqs, help="sequences per step")
    sched.add_argument(
        "--max-batched-tokens", type=int, default=engine.max_num_batched_tokens, help="tokens per step"
    )
    sched.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    sched.add_argument(
        "--schedule-policy",
        choices=("fcfs", "lpm"),
        default=engine.schedule_policy,
        help=f"admission order (default {engine.schedule_policy}: longest cached prefix first)",
    )
    sched.add_argument(
        "--preemption-mode",
        choices=("recompute", "swap"),
        default=engine.preemption_mode,
        help="under memory pressure",
    )
    sched.add_argument(
        "--swap-blocks", type=int, default=0, help="host pool blocks for --preemption-mode swap"
    )
    sched.add_argument(
        "--session-ttl",
        type=float,
        default=engine.session_ttl_s,
        help="session lease seconds after last use",
    )
    sched.add_argument(
        "--default-max-tokens",
        type=int,
        default=Limits.default_max_tokens,
        help="max_tokens when a request omits it",
    )
    sched.add_argument(
        "--stream-interval",
        type=int,
        default=engine.stream_interval,
        help=f"tokens per streamed chunk after the first (default {engine.stream_interval}: each token)",
    )
    sched.add_argument(
        "--speculative-tokens",
        type=int,
        default=engine.speculative_tokens,
        help="most draft tokens (from the prefix cache and the request's own context) a sequence verifies "
        "per step, within a per-step budget learned from step timings; same output as plain decoding; "
        f"0 = off (default {engine.speculative_tokens}: on)",
    )
    sched.add_argument(
        "--stream-buffer", type=int, default=Limits.stream_buffer, help="outputs buffered per stream"
    )
    sched.add_argument("--grace-period", type=float, default=30.0, help="SIGTERM: seconds streams may finish")
    ops = parser.add_argument_group("logging")
    ops.add_argument("--log-level", default="info", help="debug, info, warning or error")
    ops.add_argument(
        "--log-format", choices=("auto", "json", "console"), default="auto", help="auto = JSON off a tty"
    )


def run(args: argparse.Namespace) -> int:
    """Load the model, start the engine and serve until SIGTERM / SIGINT; returns the exit code."""
    log.configure(args.log_level, args.log_format)
    from radixd.daemon.server.app import serve_forever  # heavy imports after logging is configured

    return serve_forever(args)
