"""radixd_client is installable alone: importing it must pull in neither radixd nor torch."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
import radixd_client, radixd_client.cli, radixd_client.aio
from radixd_client._pb import cache_admin_pb2_grpc, generation_pb2_grpc, session_pb2_grpc
# (grpc_tools is left out: grpcio itself imports it when it happens to be installed.)
banned = {"radixd", "torch", "numpy", "structlog", "prometheus_client"}
bad = sorted(m for m in sys.modules if m.split(".")[0] in banned)
print(json.dumps(bad))
"""


def test_client_imports_only_grpc_and_protobuf() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    leaked = json.loads(out.stdout.strip().splitlines()[-1])
    assert leaked == [], (
        f"radixd_client imported {leaked}; the client package may import only grpcio + protobuf"
    )
