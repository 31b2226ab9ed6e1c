"""`radixd cluster --replicas N`: N `radixd serve` replicas on free loopback ports, smg in front.

    radixd cluster --replicas 2 --port 8000 -- --num-blocks 512

Flags after `--` go to every replica (one shared admin token). On a signal the gateway stops, then the
replicas drain (exit 0 if all clean); a dead replica is routed around (exit 1 later); if smg or the last
replica dies, everything stops (exit 1)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixd.daemon.engine.config import DEFAULT_BLOCK_SIZE

STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0

# smg 1.13's (tool-call, reasoning) parsers per model family (radixd.daemon.loaders.family), so that
# tool_choice "auto" yields tool_calls where the family has a tool format; families not named: none.
SMG_PARSERS: dict[str, tuple[str | None, str | None]] = {
    "llama3": ("llama", None),
    "mistral": ("mistral", None),
    "qwen2": ("qwen", None),
    "qwen3": ("qwen", "qwen3"),
    "qwen3-instruct": ("qwen", None),
    "qwen3-thinking": ("qwen", "qwen3_thinking"),
    "functiongemma": ("function_gemma", None),
}


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    info: dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `radixd cluster` (everything after `--` goes to each `radixd serve`)."""
    parser.add_argument("--replicas", type=int, default=2, help="radixd serve processes (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="gateway HTTP port (0 = a free one)")
    parser.add_argument(
        "--policy",
        default="cache_aware",
        help="smg routing policy: cache_aware (default), round_robin, random, power_of_two, ...",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help=f"tokens per KV block, replicas and smg (default {DEFAULT_BLOCK_SIZE})",
    )
    parser.add_argument("--admin-token", default=os.environ.get("RADIXD_ADMIN_TOKEN"), help="shared")
    parser.add_argument("--smg", default=None, help="the smg binary (default: beside python, then PATH)")
    parser.add_argument(
        "--gateway-arg", action="append", default=[], metavar="ARG", help="extra smg flag (repeatable)"
    )
    parser.add_argument("--ready-file", metavar="PATH", help="write the addresses as JSON once ready")
    parser.add_argument("--log-dir", metavar="DIR", help="children's logs (default: a temporary folder)")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then flags for every radixd serve")


def _smg_binary(explicit: str | None) -> str:
    candidates = [explicit] if explicit else [str(Path(sys.executable).with_name("smg")), "smg"]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    raise SystemExit(
        "radixd cluster: the smg gateway binary was not found; install it with"
        " `pip install 'radixd[gateway]'` (smg==1.13.0) or pass --smg PATH"
    )


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The last value given to `flag` (as `FLAG V` or `FLAG=V`) in `args`, else None."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def parser_args(family: str, gateway_args: Sequence[str]) -> list[str]:
    """smg's parser flags for `family`, less any the user passed with --gateway-arg (theirs win)."""
    tool, reasoning = SMG_PARSERS.get(family, (None, None))
    out: list[str] = []
    for flag, name in (("--tool-call-parser", tool), ("--reasoning-parser", reasoning)):
        if name and _flag_value(gateway_args, flag) is None:
            out += [flag, name]
    return out


def _model_family(serve_args: Sequence[str]) -> str:
    """The family of the model the replicas will serve (metadata only; no weights are loaded)."""
    from radixd.daemon.loaders import ModelLoadError, default_model_path
    from radixd.daemon.loaders.family import model_family

    try:
        return model_family(_flag_value(serve_args, "--model") or default_model_path())
    except ModelLoadError:
        return ""  # the replicas report the problem themselves


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (smg takes no port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        # A session of its own, so Ctrl-C reaches only this command, which stops the children in order.
        # Unbuffered, so a replica's log file shows each line as it happens.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _wait_ready_file(
    proc: subprocess.Popen[bytes], path: Path, log_path: Path, deadline: float
) -> dict[str, Any]:
    while time.monotonic() < deadline:
        if path.exists():
            info: dict[str, Any] = json.loads(path.read_text())
            return info
        if proc.poll() is not None:
            raise RuntimeError(f"a replica exited with {proc.returncode} before serving; see {log_path}")
        time.sleep(0.1)
    raise RuntimeError(f"a replica did not serve within {STARTUP_TIMEOUT_S:.0f} s; see {log_path}")


def _wait_gateway(
    proc: subprocess.Popen[bytes], url: str, replicas: int, log_path: Path, deadline: float
) -> None:
    """Until smg lists a model and answers a one-token completion."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"smg exited with {proc.returncode} while starting; see {log_path}")
        try:
            with urllib.request.urlopen(f"{url}/workers", timeout=2) as resp:
                workers = json.loads(resp.read())
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
                models = json.loads(resp.read())
            listed = workers.get("workers", workers) if isinstance(workers, dict) else workers
            if models.get("data") and len(listed) >= replicas:
                # smg registers the tokenizer after listing the model: one token proves it routes
                model = models["data"][0]["id"]
                probe = {"model": model, "prompt": "ready", "max_tokens": 1}
                req = urllib.request.Request(
                    f"{url}/v1/completions", json.dumps(probe).encode(), {"content-type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=30) as resp:
                    if resp.status == 200:
                        return
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"smg did not route to the replicas within {STARTUP_TIMEOUT_S:.0f} s; see {log_path}")


def _stop(children: Sequence[Child], sig: int = signal.SIGTERM) -> bool:
    """Signal the children together and wait for them; True when all exited 0 (or by `sig`)."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(sig)
    clean = True
    for child in children:
        try:
            code = child.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            code = child.proc.wait()
        if code not in (0, -sig):
            print(f"radixd cluster: {child.name} exited with {code}", file=sys.stderr, flush=True)
            clean = False
    return clean


def run(args: argparse.Namespace) -> int:
    """Start the replicas and the gateway, print where they listen, stop them all on a signal."""
    if args.replicas < 1:
        raise SystemExit("radixd cluster: --replicas must be >= 1")
    serve_args = [a for a in args.serve_args if a != "--"]
    smg = _smg_binary(args.smg)
    token = args.admin_token or secrets.token_urlsafe(24)
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="radixd-cluster-"))
    logs.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    replicas: list[Child] = []
    gateway: Child | None = None
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for i in range(args.replicas):
            ready = logs / f"replica-{i}.json"
            ready.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "radixd.daemon.cli", "serve", "--port", "0", "--admin-token", token]
            cmd += ["--block-size", str(args.block_size), "--ready-file", str(ready), *serve_args]
            replicas.append(
                Child(f"replica {i}", _spawn(cmd, logs / f"replica-{i}.log"), {"ready": str(ready)})
            )
        family = _model_family(serve_args)  # while the replicas load
        for i, child in enumerate(replicas):
            child.info = _wait_ready_file(
                child.proc, logs / f"replica-{i}.json", logs / f"replica-{i}.log", deadline
            )
        port = args.port or free_port(args.host)
        metrics_port = free_port(args.host)
        cmd = [smg, "launch", "--host", args.host, "--port", str(port), "--policy", args.policy]
        cmd += ["--worker-urls", *(f"grpc://{c.info['address']}" for c in replicas)]
        cmd += ["--block-size", str(args.block_size), "--prometheus-host", args.host]
        cmd += ["--prometheus-port", str(metrics_port), *args.gateway_arg]
        cmd += parser_args(family, args.gateway_arg)
        url = f"http://{args.host}:{port}"
        gateway = Child("smg", _spawn(cmd, logs / "smg.log"), {"url": url})
        _wait_gateway(gateway.proc, url, args.replicas, logs / "smg.log", deadline)
    except (RuntimeError, OSError) as exc:
        print(f"radixd cluster: {exc}", file=sys.stderr, flush=True)
        _stop([c for c in (gateway, *replicas) if c is not None])
        return 1
    where: dict[str, Any] = {
        "openai_base_url": f"{url}/v1",
        "gateway_url": url,
        "gateway_metrics": f"http://{args.host}:{metrics_port}/metrics",
        "admin_token": token,
        "logs": str(logs),
        "gateway_pid": gateway.proc.pid,
        "replicas": [
            {k: c.info[k] for k in ("address", "admin_address", "metrics_url", "pid")} for c in replicas
        ],
    }
    if args.ready_file:
        tmp = Path(args.ready_file + ".tmp")
        tmp.write_text(json.dumps({**where, "pid": os.getpid()}))
        tmp.replace(args.ready_file)
    print(
        f"radixd cluster ready: openai_base_url={where['openai_base_url']}"
        f" gateway_metrics={where['gateway_metrics']} logs={logs}",
        flush=True,
    )
    if not args.admin_token:
        print(f"radixd cluster: admin token (generated): {token}", flush=True)
    for i, r in enumerate(where["replicas"]):
        print(
            f"replica {i}: address={r['address']} admin_address={r['admin_address']}"
            f" metrics={r['metrics_url']}",
            flush=True,
        )
    lost: set[str] = set()
    while not stop.wait(0.5):
        if gateway.proc.poll() is not None:
            print(f"radixd cluster: smg exited with {gateway.proc.returncode}; stopping", file=sys.stderr)
            _stop(replicas)
            return 1
        for child in replicas:
            if child.proc.poll() is not None and child.name not in lost:
                # smg notices the lost worker and routes to the others; the cluster keeps serving.
                lost.add(child.name)
                print(f"radixd cluster: {child.name} exited with {child.proc.returncode}", file=sys.stderr)
        if len(lost) == len(replicas):
            print("radixd cluster: no replica is left; stopping", file=sys.stderr, flush=True)
            _stop([gateway])
            return 1
    print("radixd cluster: stopping (gateway first, then the replicas drain)", flush=True)
    gateway_ok = _stop([gateway])
    replicas_ok = _stop([c for c in replicas if c.name not in lost])
    return 0 if gateway_ok and replicas_ok and not lost else 1
