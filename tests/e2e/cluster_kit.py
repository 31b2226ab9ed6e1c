"""Helpers for the cluster tests: `radixd cluster` as a subprocess, OpenAI calls through smg over HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e_kit import ADMIN_TOKEN, wait_until
from radixd_client import Client

MODEL = "SmolLM2-135M-Instruct"


@dataclass
class Cluster:
    proc: subprocess.Popen[bytes]
    info: dict[str, Any]
    out: Path

    @property
    def base(self) -> str:
        return str(self.info["openai_base_url"])

    def replica(self, i: int) -> Client:
        r = self.info["replicas"][i]
        return Client(r["address"], admin_address=r["admin_address"], admin_token=ADMIN_TOKEN)

    def replica_logs(self, i: int) -> list[dict[str, Any]]:
        text = (Path(self.info["logs"]) / f"replica-{i}.log").read_text()
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def ensure_stopped(self) -> None:
        """Teardown: a clean stop, else kill the command and every child it started (they run in
        sessions of their own, so killing the command alone would leave them running)."""
        try:
            self.stop(signal.SIGINT, 90.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        pids = [self.info["gateway_pid"], *(r["pid"] for r in self.info["replicas"])]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_cluster(tmp: Path, replicas: int = 2, *serve: str, policy: str = "cache_aware") -> Cluster:
    """`radixd cluster` on free ports (the caller's RADIXD_CACHE_DIR holds the converted model)."""
    ready, out = tmp / "cluster.json", tmp / "cluster.out"
    cmd = [sys.executable, "-m", "radixd.daemon.cli", "cluster", "--replicas", str(replicas), "--port", "0"]
    cmd += ["--policy", policy, "--admin-token", ADMIN_TOKEN, "--ready-file", str(ready)]
    cmd += ["--log-dir", str(tmp / "logs"), "--", "--log-format", "json", *serve]
    with out.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=300, what="the cluster")
    except AssertionError:
        proc.kill()
        raise
    assert proc.poll() is None, out.read_text()
    return Cluster(proc, json.loads(ready.read_text()), out)


def post(base: str, path: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    req = urllib.request.Request(
        base + path, json.dumps(body).encode(), {"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def get(base: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + path, timeout=30) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


class SseStream:
    """A streamed POST read event by event; `close()` drops the connection (a client disconnect)."""

    def __init__(self, base: str, path: str, body: dict[str, Any], timeout: float = 120.0) -> None:
        url = urllib.parse.urlsplit(base + path)
        self.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
        self.conn.request("POST", url.path, json.dumps(body), {"content-type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()

    def events(self) -> Iterator[dict[str, Any]]:
        """Each `data:` payload until `[DONE]` (an `{"error": ...}` payload is yielded too)."""
        for raw in self.resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)

    def close(self) -> None:
        self.conn.close()


def stream_chat(base: str, body: dict[str, Any]) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The text, the usage and every event of a streamed chat completion."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    stream = SseStream(base, "/chat/completions", body)
    events = list(stream.events())
    stream.close()
    text = "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices", []))
    usage = next((e["usage"] for e in events if e.get("usage")), {})
    return text, usage, events


def cached_on(client: Client, messages: list[dict[str, str]]) -> int:
    """How many tokens of `messages` (rendered with the generation prompt) a replica holds."""
    return int(client.lookup_prefix(messages).cached_tokens)


def wait_released(clients: list[Client], timeout: float = 15.0) -> None:
    wait_until(lambda: all(c.cache_stats().in_use_blocks == 0 for c in clients), timeout, "blocks released")
