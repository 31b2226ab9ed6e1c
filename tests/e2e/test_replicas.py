"""Replicas on one host: two `radixd serve` processes given nothing but `--port 0` both come up and serve.

The admin and metrics ports default to free ones; each daemon reports where it landed in its stdout
ready line, its `server.serving` log event and its `--ready-file`, and radixctl finds a daemon's admin
service from that file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from e2e_kit import ADMIN_TOKEN, wait_until
from radixd_client import Client
from radixd_client import cli as radixctl

from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow
READY_LINE = re.compile(r"^radixd ready: address=(\S+) admin_address=(\S+) metrics=(\S+)$", re.MULTILINE)


def _spawn(tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    ready, out = tmp / f"{name}.json", tmp / f"{name}.log"
    # NOTE: deliberately no --admin-port / --metrics-port: the defaults are what this test is about.
    cmd = [sys.executable, "-m", "radixd.daemon.cli", "serve", "--port", "0", "--admin-token", ADMIN_TOKEN]
    cmd += ["--num-blocks", "64", "--log-format", "json", "--ready-file", str(ready)]
    with out.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    return proc, ready, out


def test_two_daemons_with_default_admin_and_metrics_ports_both_serve(
    loaded_model: LoadedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # loaded_model: the conversion cache is filled once, and the children inherit its RADIXD_CACHE_DIR.
    daemons = [_spawn(tmp_path, name) for name in ("first", "second")]
    try:

        def started() -> bool:
            return all(ready.exists() or proc.poll() is not None for proc, ready, _ in daemons)

        wait_until(started, timeout=300, what="both daemons to serve")
        for proc, _, out in daemons:
            assert proc.poll() is None, out.read_text()
        infos = [json.loads(ready.read_text()) for _, ready, _ in daemons]
        for key in ("address", "admin_address", "metrics_url"):
            assert infos[0][key] != infos[1][key], infos

        for (proc, ready, out), info in zip(daemons, infos, strict=True):
            text = out.read_text()
            lines = READY_LINE.findall(text)
            assert lines == [(info["address"], info["admin_address"], info["metrics_url"])], text
            events = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
            serving = [e for e in events if e.get("event") == "server.serving"]
            assert len(serving) == 1 and serving[0]["admin_address"] == info["admin_address"]
            assert serving[0]["metrics_url"] == info["metrics_url"]
            assert info["pid"] == proc.pid and info["address"].endswith(f":{info['port']}")

            with Client(info["address"], admin_address=info["admin_address"], admin_token=ADMIN_TOKEN) as c:
                assert c.health() == "SERVING"
                reply = c.complete("The capital of France is", max_tokens=4, temperature=0.0)
                assert reply.completion_tokens == 4
                total = c.cache_stats().total_blocks
                assert 0 < total <= 64
            with urllib.request.urlopen(info["metrics_url"], timeout=10) as resp:
                assert f"radixd_blocks_total {total}.0".encode() in resp.read()

            # radixctl reaches this daemon's admin service through its ready file alone.
            capsys.readouterr()
            assert radixctl.main(["--ready-file", str(ready), "--admin-token", ADMIN_TOKEN, "stats"]) == 0
            assert f"total_blocks: {total}" in capsys.readouterr().out

        for proc, _, _ in daemons:
            proc.send_signal(signal.SIGTERM)
        for proc, _, out in daemons:
            assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        for proc, _, _ in daemons:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_radixctl_says_where_to_find_the_admin_port(capsys: pytest.CaptureFixture[str]) -> None:
    # A port nothing listens on: what an admin command meets when the daemon chose another admin port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    code = radixctl.main(["--admin-address", closed, "--admin-token", "t", "--timeout", "5", "stats"])
    err = capsys.readouterr().err
    assert code == 2
    assert "UNAVAILABLE" in err and f"no admin service answered at {closed}" in err
    assert "--admin-address" in err and "--ready-file" in err


def test_radixctl_ready_file_gives_addresses_and_flags_win(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"address": "127.0.0.1:7001", "admin_address": "127.0.0.1:7002"}))
    parser = radixctl.build_parser()
    args = parser.parse_args(["--ready-file", str(ready), "health"])
    assert radixctl.resolve_addresses(args) == ("127.0.0.1:7001", "127.0.0.1:7002")
    args = parser.parse_args(["--ready-file", str(ready), "--admin-address", "127.0.0.1:9", "health"])
    assert radixctl.resolve_addresses(args) == ("127.0.0.1:7001", "127.0.0.1:9")
    args = parser.parse_args(["--ready-file", str(tmp_path / "missing.json"), "health"])
    with pytest.raises(SystemExit, match="cannot read the ready file"):
        radixctl.resolve_addresses(args)
