# slime_hydra: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
export HF_HUB_OFFLINE := 1
unexport PYTHONDONTWRITEBYTECODE  # this project's own modules get their bytecode too (it goes to ignored __pycache__/)
export TOKENIZERS_PARALLELISM := false

.PHONY: help install run test test-fast test-all lint bench bench-rollout bench-algorithms bench-async bench-megatron bench-megatron-mix bench-sglang-gpu bench-data bench-engine-start bench-weight-sync clean golden slime-flags

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

NEED_GB := 13

$(STAMP): pyproject.toml
	@free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); if [ "$$free" -lt $(NEED_GB) ]; then \
	  echo "make: the install needs about $(NEED_GB) GB free here ($(CURDIR)); df reports $$free GB." \
	       "Free space (old clones' .venv folders, /tmp) and rerun." >&2; exit 2; fi
	$(PYTHON) -m venv $(VENV)
	# Bytecode is written on first import, not at install: make leaves PYTHONDONTWRITEBYTECODE out (set on the CI
	# machines, it stopped every process writing bytecode, and each of the tier's hundreds compiled torch, transformers and
	# SGLang from source again: `import sglang.srt.managers.scheduler` 27.7 s without bytecode, 13.1 s with). The stack's
	# runs and tests import about 9,300 of site-packages' 45,000 modules: compiling all of them at install took 55 s of
	# the CI's wall time (compileall on both cores); on demand, the clean-clone CI's install took 140 s instead of 186 s.
	$(VENV)/bin/pip install -q --no-compile -e '.[bench]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP) ## create .venv and install the pinned stack (about 4 minutes, 11 GB)

run: $(STAMP) ## set up, then run the embedded default (tiny Qwen3 learns addition on CPU)
	$(VENV)/bin/slime-hydra

# the default tier on two workers, whole files each (module fixtures start once), in collection order (long modules first)
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

test: $(STAMP) ## set up, then run the test tier CI runs (two workers)
	$(PY) -m pytest -q $(XDIST)

test-fast: $(STAMP) ## the unit layer for the edit-test loop: no Ray, no SGLang server, no megatron ranks, no whole runs (< 3 min)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not gpu and not integration"

test-all: $(STAMP) ## every test, slow ones included
	$(PY) -m pytest -q $(XDIST) -m "not gpu"

bench: $(STAMP) ## the embedded default against TRL's GRPOTrainer, same model/data/reward/batch
	$(PY) -m benchmarks.bench_grpo_vs_trl
	$(PY) -m benchmarks.bench_rollout

bench-rollout: $(STAMP) ## rollout tokens/s and weight-sync seconds: local vs sglang (two engines + router) on CPU
	$(PY) -m benchmarks.bench_rollout

bench-engine-start: $(STAMP) ## an SGLang CPU engine's start to its first request: children forked vs spawned
	$(PY) -m benchmarks.bench_engine_start

bench-weight-sync: $(STAMP) ## a CPU weight sync to two SGLang engines: one TLS context per process vs one per request
	$(PY) -m benchmarks.bench_weight_sync

bench-algorithms: $(STAMP) ## every algorithm= option from one warm start: held-out accuracy and wall time
	$(PY) -m benchmarks.bench_algorithms

bench-async: $(STAMP) ## train_mode=sync vs async on the embedded default: s/rollout and held-out accuracy, 2 seeds
	$(PY) -m benchmarks.bench_async

bench-data: $(STAMP) ## prompt data: in-memory vs streaming vs streaming+workers (10M generated rows; ROWS=200000 for fewer)
	$(PY) -m benchmarks.bench_data --rows $(or $(ROWS),10000000)

bench-megatron: ## (GPU) megatron vs torch backend: train tokens/s, MFU, peak memory, Qwen3-0.6B/4B shapes, seq 2048
	$(PY) -m benchmarks.bench_megatron

bench-megatron-mix: ## (GPU) padded vs packed vs packed + token budget on a realistic RL length mix, 4B/0.6B (TINY=1: on CPU)
	$(PY) -m benchmarks.bench_megatron --mix $(if $(TINY),--tiny)

bench-sglang-gpu: ## (GPU) sglang backend vs raw sgl.Engine tok/s, weight sync, colocated GRPO, sync vs async; 0.6B shape
	$(PYTHON) -m benchmarks.bench_sglang_gpu all

lint: $(STAMP) ## ruff (pyflakes, import order) over the package, tests and benchmarks; `make test` runs it too
	$(PY) -m ruff check slime_hydra tests benchmarks

golden: $(STAMP) ## rewrite tests/golden/ (every experiment's composed config) after an intended change
	$(PY) -m tests.config.test_experiments

slime-flags: $(STAMP) ## rewrite docs/slime_flags.md (slime's flags -> keys here) after a change of the schema or the flag map
	$(PY) -m slime_hydra.app.slime_flag_map

clean: ## remove run outputs (keeps .venv)
	rm -rf outputs multirun mlruns mlruns.db bench_out
