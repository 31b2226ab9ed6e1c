"""llama.cpp's llama-server as a benchmark peer: started on a free loopback port on radixd's own GGUF.

Benchmarks that compare a radixd path with llama-server (bench/single_stream.py) start it here, post
to its native `/completion` endpoint with token ids (so both sides see the same tokens) and read its
own timings.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchkit import default_model_path


def require_binary(path: str) -> str:
    """`path` if it is an executable file; else exit with a message saying how to get llama-server."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SystemExit(
            f"no llama-server binary at {path!r}: build llama.cpp (e.g. shared/bench/build_llama_cpp.sh DIR) "
            "and pass --llama-server DIR/llama/build/bin/llama-server"
        )
    return path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST `body` as JSON to `url`; -> the decoded JSON answer."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


class LlamaServer:
    """A running llama-server (`with LlamaServer(path, threads) as url:` gives its `/completion` URL).

    `slots`: parallel sequences (`-np`); `context`: tokens of context per slot; `extra`: more flags
    (e.g. its n-gram speculation); `model`: the GGUF (default: radixd's embedded one)."""

    def __init__(
        self,
        path: str,
        threads: int,
        slots: int = 1,
        context: int = 4096,
        extra: Sequence[str] = (),
        model: str | None = None,
    ) -> None:
        port = free_port()
        cmd = [path, "-m", model or default_model_path(), "--port", str(port), "-t", str(threads)]
        cmd += ["-c", str(context * slots), "-np", str(slots), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        self.url = self.base + "/completion"

    def ready(self) -> str:
        """Wait until it serves; -> its `/completion` URL."""
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self.url
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("llama-server did not come up in 120 s")

    def close(self) -> None:
        """Stop the server."""
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> str:
        return self.ready()

    def __exit__(self, *exc: object) -> None:
        self.close()
