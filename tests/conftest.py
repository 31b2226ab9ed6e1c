"""Fixtures shared by every test package: one real SmolLM2 per test session.

The model is converted once into a private cache folder (never the user's ~/.cache), so the whole
suite pays for one GGUF conversion and every package (daemon, engine, e2e) shares the loaded weights.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixd.daemon.loaders import LoadedModel, load_model

# NOTE: daemons the tests start (in-process or as subprocesses, which inherit this) run in the fp32
# reference mode unless a test asks for another `--dtype`: `radixd serve`'s default is `auto`.
os.environ.setdefault("RADIXD_DTYPE", "float32")


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private conversion cache for the session (never the user's ~/.cache)."""
    d = tmp_path_factory.mktemp("radixd-cache")
    old = os.environ.get("RADIXD_CACHE_DIR")
    os.environ["RADIXD_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("RADIXD_CACHE_DIR", None)
    else:
        os.environ["RADIXD_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def smollm(model_cache_dir: Path) -> LoadedModel:
    t0 = time.perf_counter()
    lm = load_model()
    lm.first_load_s = time.perf_counter() - t0  # type: ignore[attr-defined]
    return lm
