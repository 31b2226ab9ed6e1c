"""Wire the daemon: engine, public and admin gRPC servers, health, reflection, metrics, SIGTERM drain.

Drain (SIGTERM/SIGINT): health NOT_SERVING, new work UNAVAILABLE, streams get `--grace-period`, the
rest is cancelled (KV freed by the handlers' `finally`), exit 0. Engine death drains the same way and
exits 1, so a supervisor restarts the daemon."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from radixd_client._pb import (
    cache_admin_pb2,
    cache_admin_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

from radixd.daemon.engine.commands import GetStats
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.factory import BuiltEngine, build_engine
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.loaders import ModelLoadError
from radixd.daemon.process.host import startup_heap_frozen
from radixd.daemon.process.log import get_logger
from radixd.daemon.server.admin import CacheAdminServicer
from radixd.daemon.server.common.auth import Authenticator, load_api_keys
from radixd.daemon.server.common.bounds import prompt_char_bound
from radixd.daemon.server.common.cache_feed import CacheFeed
from radixd.daemon.server.common.events import CacheEvents
from radixd.daemon.server.common.handover import OutputHandover
from radixd.daemon.server.common.metrics import Metrics
from radixd.daemon.server.common.pipeline import RequestRegistry
from radixd.daemon.server.common.state import Limits, ServerState
from radixd.daemon.server.generation import GenerationServicer
from radixd.daemon.server.health import PortHealth
from radixd.daemon.server.reflection import DescriptorFiles, add_reflection
from radixd.daemon.server.sessions import SessionServicer
from radixd.daemon.server.vllm.wiring import add_vllm_service

log = get_logger("radixd.server")

PUBLIC_SERVICES = (
    generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
    session_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
)
ADMIN_SERVICE = cache_admin_pb2.DESCRIPTOR.services_by_name["CacheAdminService"].full_name
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass
class Daemon:
    """A running daemon (servers started); `drain()` stops it. `stopping`: a signal or engine death."""

    state: ServerState
    public: grpc.aio.Server
    admin: grpc.aio.Server
    health: Any
    port: int
    admin_port: int
    metrics_port: int
    metrics_server: Any
    grace_s: float
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int = 0
    _death: concurrent.futures.Future[None] | None = field(default=None, repr=False)

    async def engine_died(self, error: BaseException) -> None:
        """The engine thread is gone (it failed its requests): stop taking work and exit 1."""
        self.exit_code = 1
        self.state.draining = True  # new RPCs: UNAVAILABLE
        await self.health.enter_graceful_shutdown()
        log.critical(
            "server.engine_dead",
            error=f"{type(error).__name__}: {error}",
            action="health NOT_SERVING, refusing new work, exiting with code 1; restart the daemon",
        )
        self.stopping.set()

    def on_engine_death(self, loop: asyncio.AbstractEventLoop) -> Callable[[BaseException], None]:
        """The `Engine.on_fatal` hook: runs `engine_died` on `loop` (it is called on the engine thread)."""

        def hook(error: BaseException) -> None:
            # A closed loop means the daemon is already gone: nothing is left to stop.
            with contextlib.suppress(RuntimeError):
                self._death = asyncio.run_coroutine_threadsafe(self.engine_died(error), loop)

        return hook

    async def drain(self) -> None:
        """Refuse new work, let streams finish within the grace period, stop servers and engine."""
        state = self.state
        state.draining = True
        await self.health.enter_graceful_shutdown()
        log.info("server.draining", active_streams=state.active_streams, grace_s=self.grace_s)
        if state.active_streams:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.idle.wait(), self.grace_s)
        left = state.active_streams
        # Remaining handlers are cancelled here; their `finally` aborts the requests in the engine.
        await asyncio.gather(self.public.stop(1.0), self.admin.stop(1.0))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, state.engine.shutdown, 5.0)
        if self.metrics_server is not None:
            await loop.run_in_executor(None, self.metrics_server.shutdown)
        log.info("server.stopped", cancelled_streams=left)


def _credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key must be given together")
    if not args.tls_cert:
        return None
    pair = (Path(args.tls_key).read_bytes(), Path(args.tls_cert).read_bytes())
    return grpc.ssl_server_credentials([pair])


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(
    server: grpc.aio.Server,
    host: str,
    port: int,
    creds: grpc.ServerCredentials | None,
    flag: str = "--port",
) -> int:
    address = _host_port(host, port)
    try:
        bound = (
            server.add_secure_port(address, creds) if creds is not None else server.add_insecure_port(address)
        )
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise SystemExit(
            f"could not bind {address}: is another daemon using the port? pick another with {flag}"
            " (0 = any free port)"
        )
    return int(bound)


def build_state(args: argparse.Namespace, built: BuiltEngine) -> ServerState:
    token = args.admin_token
    if not token:
        token = secrets.token_urlsafe(24)
        log.warning("server.admin_token_generated", admin_token=token, hint="pass --admin-token to fix it")
    keys = load_api_keys(args.api_keys) if args.api_keys else None
    core = built.core
    # The engine hands its outputs over before each forward pass and before it waits for work.
    handover = OutputHandover(asyncio.get_running_loop())
    built.engine.handover = handover.flush
    return ServerState(
        handover=handover,
        engine=built.engine,
        tokenizer=built.tokenizer,
        auth=Authenticator(keys, token),
        metrics=Metrics(),
        limits=Limits(
            context_length=core.max_model_len,
            default_max_tokens=args.default_max_tokens,
            stream_buffer=args.stream_buffer,
            max_prompt_chars=prompt_char_bound(built.tokenizer.longest_token_chars, core.max_model_len),
            vocab_size=built.tokenizer.vocab_size,
            total_blocks=core.kv.usable_blocks(),
        ),
        events=CacheEvents(
            core.block_size,
            schedule=asyncio.get_running_loop().call_soon,
            window=core.kv.sliding.window if core.kv.sliding is not None else 0,
        ),
        model_name=str(args.model or "SmolLM2-135M-Instruct (embedded)"),
        block_size=core.block_size,
        eos_token_ids=tuple(core.eos_token_ids),
    )


def _servers(
    state: ServerState, args: argparse.Namespace
) -> tuple[grpc.aio.Server, grpc.aio.Server, PortHealth]:
    """The public and admin servers, each with health and reflection for its own services only."""
    size = args.max_message_mb * 1024 * 1024
    # NOTE: no SO_REUSEPORT, so a second daemon on the same port fails to start instead of silently
    # sharing the port (and splitting requests and sessions) with the first.
    options = [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.so_reuseport", 0),
    ]
    registry = RequestRegistry()
    port_health = PortHealth({"public": PUBLIC_SERVICES, "admin": (ADMIN_SERVICE,)})
    files = DescriptorFiles.load()
    public = grpc.aio.server(options=options)
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(GenerationServicer(state, registry), public)
    session_pb2_grpc.add_SessionServiceServicer_to_server(SessionServicer(state, registry), public)
    health_pb2_grpc.add_HealthServicer_to_server(port_health.servicer("public"), public)
    add_reflection(public, files, (*PUBLIC_SERVICES, health.SERVICE_NAME))
    admin = grpc.aio.server(options=options)
    cache_admin_pb2_grpc.add_CacheAdminServiceServicer_to_server(CacheAdminServicer(state), admin)
    health_pb2_grpc.add_HealthServicer_to_server(port_health.servicer("admin"), admin)
    add_reflection(admin, files, (ADMIN_SERVICE, health.SERVICE_NAME))
    return public, admin, port_health


def _start_metrics(state: ServerState, args: argparse.Namespace) -> tuple[Any, int]:
    """Start the Prometheus exporter (unless --no-metrics); -> (server or None, bound port or 0)."""
    if args.no_metrics:
        return None, 0
    engine = state.engine

    def read_stats() -> EngineStats | None:
        try:
            return engine.execute(GetStats()).result(timeout=2.0)
        except Exception:  # a scrape must never fail the exporter (engine busy, stopping, ...)
            return None

    state.metrics.add_engine_collector(read_stats)
    try:
        server = state.metrics.serve(args.metrics_port, args.metrics_host)
    except OSError as exc:
        raise SystemExit(
            f"could not serve metrics on {_host_port(args.metrics_host, args.metrics_port)} ({exc});"
            " pick another --metrics-port (0 = any free port) or pass --no-metrics"
        ) from exc
    return server, int(server.server_address[1])


def _write_ready_file(path: str, where: dict[str, int | str]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({**where, "pid": os.getpid()}))
    tmp.replace(path)  # atomic: readers never see a half-written file


def _announce(
    args: argparse.Namespace, state: ServerState, tls: bool, port: int, admin_port: int, metrics_port: int
) -> None:
    """Say where the daemon listens (free ports unless given): the log, `--ready-file` JSON and stdout."""
    address = _host_port(args.host, port)
    admin_address = _host_port(args.admin_host, admin_port)
    metrics_url = f"http://{_host_port(args.metrics_host, metrics_port)}/metrics" if metrics_port else ""
    log.info(
        "server.serving",
        address=address,
        admin_address=admin_address,
        metrics_url=metrics_url or None,
        tls=tls,
        tenants=state.auth.multi_tenant,
        try_it=f"radixctl --address {address} --admin-address {admin_address} --admin-token TOKEN stats",
    )
    if args.ready_file:
        _write_ready_file(
            args.ready_file,
            {
                "address": address,
                "admin_address": admin_address,
                "metrics_url": metrics_url,
                "port": port,
                "admin_port": admin_port,
                "metrics_port": metrics_port,
            },
        )
    # A plain line, not a log event: it shows whatever the log format and level are.
    print(
        f"radixd ready: address={address} admin_address={admin_address} metrics={metrics_url or 'off'}",
        flush=True,
    )


async def start(args: argparse.Namespace, built: BuiltEngine) -> Daemon:
    """Start the engine and both servers; returns once they accept connections."""
    state = build_state(args, built)
    if args.admin_host not in LOOPBACK:
        log.warning("server.admin_not_loopback", admin_host=args.admin_host, tls=bool(args.tls_cert))
    creds = _credentials(args)
    public, admin, health_servicer = _servers(state, args)
    loop = asyncio.get_running_loop()
    # The vLLM worker protocol (for gateways such as smg) beside radixd.v1 on the public port.
    add_vllm_service(public, state, built, args)
    state.events.feed = CacheFeed(state.engine, state.events, loop)
    port = _bind(public, args.host, args.port, creds)
    admin_port = _bind(admin, args.admin_host, args.admin_port, creds, "--admin-port")
    metrics_server, metrics_port = _start_metrics(state, args)
    daemon = Daemon(
        state,
        public,
        admin,
        health_servicer,
        port,
        admin_port,
        metrics_port,
        metrics_server,
        args.grace_period,
    )
    # NOTE: set before the engine thread starts, so the hook is in place before the engine can die.
    state.engine.on_fatal = daemon.on_engine_death(loop)
    state.engine.start()
    await public.start()
    await admin.start()
    for name in ("", *PUBLIC_SERVICES, ADMIN_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _announce(args, state, creds is not None, port, admin_port, metrics_port)
    return daemon


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the `radixd serve` flags ask for."""
    return EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        prefix_caching=not args.no_prefix_cache,
        schedule_policy=args.schedule_policy,
        max_waiting=args.max_queue,
        preemption_mode=args.preemption_mode,
        num_host_blocks=args.swap_blocks,
        session_ttl_s=args.session_ttl,
        max_model_len=args.max_model_len,
        stream_interval=args.stream_interval,
        speculative_tokens=args.speculative_tokens,
        kv_layout=args.kv_layout,
        kv_windows=args.kv_windows,
    )


def load(args: argparse.Namespace) -> BuiltEngine:
    """Load the model and build the engine (not started) from `radixd serve` flags."""
    return build_engine(
        args.model,
        engine_config(args),
        num_blocks=args.num_blocks,
        kv_cache_gb=args.kv_cache_gb,
        block_size=args.block_size,
        device=args.device,
        dtype=args.dtype,
    )


async def _serve(args: argparse.Namespace, built: BuiltEngine) -> int:
    try:
        daemon = await start(args, built)
    except (ValueError, OSError) as exc:  # bad --api-keys file, unreadable TLS files, ...
        log.error("server.start_failed", error=str(exc))
        print(f"radixd serve: {exc}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopping.set)
    await daemon.stopping.wait()
    if daemon.exit_code == 0:
        log.info("server.signal", action="drain")
    await daemon.drain()
    return daemon.exit_code


def serve_forever(args: argparse.Namespace) -> int:
    """Blocking: load, serve, drain; -> exit code (0 drained, 1 engine died, 2 could not start)."""
    log.info("server.loading", model=args.model or "embedded", device=args.device)
    try:
        built = load(args)
    except (ModelLoadError, ValueError, OSError) as exc:
        log.error("server.load_failed", error=str(exc))
        print(f"radixd serve: {exc}", file=sys.stderr)
        return 2
    runner = built.core.runner
    # NOTE: after loading and before serving: what is alive now lives as long as the daemon serves.
    with startup_heap_frozen() as frozen:
        log.info(
            "server.loaded",
            dtype=built.loaded.model.precision.name,
            kv_dtype=str(runner.dtype).removeprefix("torch."),
            kv_blocks=runner.num_blocks,
            kv_bytes_per_block=runner.kv_bytes_per_block,
            gc_frozen_objects=frozen,
        )
        return uvloop.run(_serve(args, built))
