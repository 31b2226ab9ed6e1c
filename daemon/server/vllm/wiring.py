"""Put the vLLM worker service on the daemon's public server (its KV events come from the daemon's one
cache-event log, `ServerState.events`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import grpc.aio
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from radixd.daemon.process.log import get_logger
from radixd.daemon.server.common.pipeline import RequestRegistry
from radixd.daemon.server.vllm.service import VllmEngineServicer
from radixd.daemon.server.vllm.tokenizer_bundle import build_bundle, write_dir

if TYPE_CHECKING:
    from radixd.daemon.engine.factory import BuiltEngine
    from radixd.daemon.server.common.state import ServerState

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
) -> None:
    """Register `VllmEngine` on `server`."""
    core = built.core
    bundle = build_bundle(built.tokenizer, built.loaded.config, state.limits.context_length)
    tokenizer_dir = write_dir(bundle, getattr(args, "tokenizer_dir", None))
    servicer = VllmEngineServicer(
        state,
        RequestRegistry(),
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
