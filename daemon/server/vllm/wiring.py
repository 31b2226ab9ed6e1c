"""Put the vLLM worker service on the daemon's public server and feed its KV-event logs from the tree
(while anyone subscribes: `CacheFeed`, with a replay of the cached content on install)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import grpc.aio
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from radixd.daemon.log import get_logger
from radixd.daemon.server.cache_feed import CacheFeed
from radixd.daemon.server.kv_events import KvEventLogs, KvLogBridge
from radixd.daemon.server.pipeline import RequestRegistry
from radixd.daemon.server.vllm.service import VllmEngineServicer
from radixd.daemon.server.vllm.tokenizer_bundle import build_bundle, write_dir

if TYPE_CHECKING:
    from radixd.daemon.engine.factory import BuiltEngine
    from radixd.daemon.server.state import ServerState

log = get_logger("radixd.server.vllm")
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


def served_model_name(args: argparse.Namespace) -> str:
    """`--served-model-name`, else the model file's or folder's name (the embedded model's own name)."""
    name = getattr(args, "served_model_name", None)
    if name:
        return str(name)
    model = getattr(args, "model", None)
    if not model:
        return EMBEDDED_NAME
    path = Path(model)
    return path.stem if path.is_file() else path.name


def add_vllm_service(
    server: grpc.aio.Server,
    state: ServerState,
    built: BuiltEngine,
    args: argparse.Namespace,
    loop: asyncio.AbstractEventLoop,
) -> KvEventLogs:
    """Register `VllmEngine` on `server`; -> its KV-event logs (fed by the engine while subscribed)."""
    core = built.core
    bundle = build_bundle(built.tokenizer, built.loaded.config, state.limits.context_length)
    tokenizer_dir = write_dir(bundle, getattr(args, "tokenizer_dir", None))
    logs = KvEventLogs(core.block_size, schedule=loop.call_soon)
    # NOTE: the logs keep every live block (for snapshots), so the listener's install replays the
    # cached content into them, and its removal makes them forget what would go stale.
    feed = CacheFeed(
        state.engine,
        KvLogBridge(logs, loop),
        replay=True,
        on_attach=logs.publish_pending,
        on_detach=logs.unobserved,
    )
    servicer = VllmEngineServicer(
        state,
        RequestRegistry(),
        logs,
        feed,
        config=built.loaded.config,
        model_path=built.loaded.path,
        served_model_name=served_model_name(args),
        bundle=bundle,
        tokenizer_path=str(tokenizer_dir),
        max_num_seqs=core.config.max_num_seqs,
        model_dtype=str(built.loaded.model.dtype).removeprefix("torch."),
    )
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    log.info(
        "vllm.service",
        served_model_name=servicer.served_model_name,
        tokenizer_path=servicer.tokenizer_path,
        tokenizer_sha256=bundle.sha256,
    )
    return logs
