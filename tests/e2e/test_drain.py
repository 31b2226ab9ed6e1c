"""SIGTERM on a real `radixd serve` process: NOT_SERVING, new work UNAVAILABLE, streams finish, exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from e2e_kit import ADMIN_TOKEN, serve_args, start_daemon, stop_daemon, wait_until
from radixd_client import Chunk, Client, End

from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def test_sigterm_drains_in_flight_streams_and_exits_zero(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    log = (tmp_path / "serve.log").open("w")
    cmd = [sys.executable, "-m", "radixd.daemon.cli", "serve", "--port", "0", "--admin-port", "0"]
    cmd += [
        "--metrics-port",
        "0",
        "--num-blocks",
        "128",
        "--admin-token",
        ADMIN_TOKEN,
        "--ready-file",
        str(ready),
    ]
    cmd += ["--grace-period", "60", "--log-format", "json"]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=120, what="the daemon to serve")
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        port = json.loads(ready.read_text())["port"]
        with Client(f"127.0.0.1:{port}") as c, Client(f"127.0.0.1:{port}") as other:
            assert c.health() == "SERVING"
            stream = iter(c.generate("Count slowly:", max_tokens=40, ignore_eos=True, temperature=0.0))
            events = [next(stream)]
            while not isinstance(events[-1], Chunk):
                events.append(next(stream))
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: other.health() == "NOT_SERVING", timeout=10, what="health NOT_SERVING")
            with pytest.raises(grpc.RpcError) as err:
                other.complete("new work", max_tokens=2)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in err.value.details()
            events += list(stream)
        end = events[-1]
        assert isinstance(end, End) and end.finish_reason == "length" and end.completion_tokens == 40
        t0 = time.monotonic()
        assert proc.wait(timeout=60) == 0
        assert time.monotonic() - t0 < 30
        # Logs are JSON (stdout is not a terminal) and stream lines carry the request id.
        lines = [
            json.loads(x) for x in (tmp_path / "serve.log").read_text().splitlines() if x.startswith("{")
        ]
        assert any(x.get("event") == "server.stopped" for x in lines)
        # The startup heap (model, tokenizer tables, pools) is out of the garbage collector's sight.
        loaded = [x for x in lines if x.get("event") == "server.loaded"]
        assert loaded and loaded[0]["gc_frozen_objects"] > 10_000
        # ... and thawed before exit: teardown finds the heap as usual (no leak report from C extensions).
        assert "leaked" not in (tmp_path / "serve.log").read_text()
        ends = [x for x in lines if x.get("event") == "stream.end"]
        assert ends and all(x.get("request_id") and x.get("rpc") == "Generate" for x in ends)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_streams_past_the_grace_period_are_cancelled_and_release_their_blocks(
    loaded_model: LoadedModel, tmp_path: Path
) -> None:
    d = start_daemon(loaded_model, serve_args(tmp_path, "--grace-period", "0.5"))
    stopped = False
    try:
        with d.client() as c:
            stream = iter(c.generate("Never ending:", max_tokens=400, ignore_eos=True))
            while not isinstance(next(stream), Chunk):
                pass
            t0 = time.monotonic()
            stop_daemon(d)
            stopped = True
            assert time.monotonic() - t0 < 15
            with pytest.raises(grpc.RpcError):
                list(stream)
        core = d.state.engine.core
        assert not core.requests, "the cut-off request is still in the engine"
        assert core.kv.pool.num_free == core.kv.usable_blocks() - core.kv.tree.stats().evictable_blocks
    finally:
        if not stopped:
            stop_daemon(d)
