"""Build an engine from a model path: load the model, size the KV pool, make runner and core."""

from __future__ import annotations

from dataclasses import dataclass

from radixd.daemon.engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_GB, EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.engine import Engine
from radixd.daemon.executor.runner import ModelRunner, num_blocks_for_budget
from radixd.daemon.loaders import LoadedModel, load_model
from radixd.daemon.model import KVLayout
from radixd.daemon.structured.cache import GrammarCache
from radixd.daemon.text.tokenizer import TextTokenizer


@dataclass
class BuiltEngine:
    """What callers need beside the engine: the tokenizer (prompts, chat template) and the model."""

    engine: Engine
    core: EngineCore
    tokenizer: TextTokenizer
    loaded: LoadedModel


def build_core(
    loaded: LoadedModel,
    config: EngineConfig | None = None,
    num_blocks: int | None = None,
    kv_cache_gb: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    device: str = "cpu",
    grammars: GrammarCache | None = None,
) -> EngineCore:
    """An `EngineCore` over a loaded model; pool: `num_blocks`, else what `kv_cache_gb` holds, in the
    KV layout `config.kv_layout` picks."""
    layout = KVLayout.choose(loaded.config, (config or EngineConfig()).kv_layout)
    if num_blocks is None:
        budget = int((kv_cache_gb if kv_cache_gb is not None else DEFAULT_KV_CACHE_GB) * (1 << 30))
        num_blocks = num_blocks_for_budget(loaded.config, block_size, budget, loaded.model.kv_dtype, layout)
    runner = ModelRunner(
        loaded.model, num_blocks=num_blocks, block_size=block_size, device=device, layout=layout
    )
    eos = tuple(loaded.tokenizer.eos_token_ids) or tuple(loaded.config.eos_token_ids)
    core = EngineCore(runner, loaded.tokenizer, config, eos_token_ids=eos, grammars=grammars)
    core.grammars.prepare()  # llguidance's tokenizer, built in the background (once per model)
    return core


def build_engine(
    model_path: str | None = None,
    config: EngineConfig | None = None,
    num_blocks: int | None = None,
    kv_cache_gb: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    device: str = "cpu",
    dtype: str | None = None,
) -> BuiltEngine:
    """Load the model (default: the embedded SmolLM2) and build a not-yet-started `Engine`."""
    loaded = load_model(model_path, device=device, dtype=dtype)
    core = build_core(loaded, config, num_blocks, kv_cache_gb, block_size, device)
    return BuiltEngine(Engine(core), core, loaded.tokenizer, loaded)
