"""TLS on both ports with --tls-cert / --tls-key (a throwaway self-signed certificate for 127.0.0.1)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from e2e_kit import ADMIN_TOKEN, serve_args, start_daemon, stop_daemon
from radixd_client import Client

from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    # NOTE: the openssl CLI is part of the machine image this suite runs on; without it the TLS check
    # must fail, not vanish.
    assert shutil.which("openssl"), "the TLS test needs the openssl command to make a certificate"
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
    cmd += ["-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(
        cmd,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_tls_serves_verified_clients_only(loaded_model: LoadedModel, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    d = start_daemon(loaded_model, serve_args(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key)))
    try:
        root = cert.read_bytes()
        with Client(
            d.address, admin_address=d.admin_address, admin_token=ADMIN_TOKEN, root_certificates=root
        ) as c:
            assert c.health() == "SERVING"
            assert c.complete("Hello over TLS", max_tokens=2).completion_tokens == 2
            assert c.cache_stats().total_blocks > 0
        with Client(d.address) as plain:
            with pytest.raises(grpc.RpcError) as err:
                plain.health(timeout=3.0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stop_daemon(d)
