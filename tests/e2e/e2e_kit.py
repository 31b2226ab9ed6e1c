"""Helpers for the end-to-end tests: a real daemon on 127.0.0.1 free ports over the real model.

The daemon runs on its own uvloop thread in this process (so tests can also peek at engine state);
clients talk to it over real loopback gRPC. The model is loaded once per session and shared by the
modules' engines (weights are read-only; each engine has its own KV pool).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvloop
from radixd_client import Client

from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.factory import BuiltEngine, build_core
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server import main as server_main
from radixd.daemon.server.app import Daemon, engine_config, start
from radixd.daemon.server.common.state import ServerState

T = TypeVar("T")
ADMIN_TOKEN = "e2e-admin-token"
API_KEYS = {"key-alice": "alice", "key-bob": "bob"}
NUM_BLOCKS = 192


@dataclass
class RunningDaemon:
    daemon: Daemon
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    api_key: str | None

    @property
    def state(self) -> ServerState:
        return self.daemon.state

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.daemon.port}"

    @property
    def admin_address(self) -> str:
        return f"127.0.0.1:{self.daemon.admin_port}"

    def client(self, api_key: str | None = "default", admin_token: str | None = ADMIN_TOKEN) -> Client:
        key = self.api_key if api_key == "default" else api_key
        return Client(self.address, api_key=key, admin_address=self.admin_address, admin_token=admin_token)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def serve_args(tmp: Path, *extra: str, api_keys: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server_main.add_arguments(parser)
    argv = ["--port", "0", "--admin-port", "0", "--metrics-port", "0", "--admin-token", ADMIN_TOKEN]
    argv += ["--num-blocks", str(NUM_BLOCKS), "--default-max-tokens", "16", *extra]
    if api_keys:
        keys = tmp / "api-keys.txt"
        keys.write_text("# key tenant\n" + "".join(f"{k} {t}\n" for k, t in API_KEYS.items()))
        argv += ["--api-keys", str(keys)]
    return parser.parse_args(argv)


def build(loaded: LoadedModel, args: argparse.Namespace) -> BuiltEngine:
    """An engine (not started) over `loaded` with the flags in `args`."""
    core = build_core(loaded, engine_config(args), num_blocks=args.num_blocks, block_size=args.block_size)
    return BuiltEngine(Engine(core), core, loaded.tokenizer, loaded)


def start_daemon(loaded: LoadedModel, args: argparse.Namespace, api_key: str | None = None) -> RunningDaemon:
    """Build an engine over `loaded` with the flags in `args` and start the daemon on a uvloop thread."""
    built = build(loaded, args)
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="e2e-daemon-loop", daemon=True)
    thread.start()
    daemon = asyncio.run_coroutine_threadsafe(start(args, built), loop).result(60)
    return RunningDaemon(daemon, loop, thread, api_key)


def stop_daemon(d: RunningDaemon) -> None:
    d.run(d.daemon.drain())
    d.loop.call_soon_threadsafe(d.loop.stop)
    d.thread.join(10)
    d.loop.close()
