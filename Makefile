# Two commands on a fresh machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The first start of Prefect's local API migrates its SQLite database; on a small
# machine that can take ~40 s, longer than Prefect's default start-up timeout.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
# Prefect's telemetry service writes to that database while it migrates ("database
# is locked") and needs the internet; the local API runs without it.
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
# On a GPU machine, install the RAPIDS extra matching the driver: CUDA 13 wheels
# need driver >= 580, CUDA 12 wheels run on older ones.
GPU_EXTRA := $(shell d=$$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | cut -d. -f1); \
	if [ -n "$$d" ]; then if [ "$$d" -ge 580 ]; then echo ,cu13; else echo ,cu12; fi; fi)

comma := ,
# `make run` (and the worker) install the package with the GPU extra only;
# `make test` and `make bench` add the test extra, and without a GPU the check
# extra (cudf-polars, so the cpu backend checks plans as the GPU would).
RUN_EXTRAS := $(if $(GPU_EXTRA),[$(subst $(comma),,$(GPU_EXTRA))])
TEST_EXTRAS := test$(if $(GPU_EXTRA),$(GPU_EXTRA),$(comma)check)
RUN_STAMP := $(VENV)/.installed-run$(GPU_EXTRA)
TEST_STAMP := $(VENV)/.installed-test$(GPU_EXTRA)
# The test install takes its versions from CONSTRAINTS (`make constraints` writes it),
# so a new release of a test tool or of Prefect changes nothing until the file does.
# On a GPU machine the cu13 or cu12 extra decides the CUDA and RAPIDS packages, and
# rapids-dask-dependency pins dask and distributed: their pins (made with the check
# extra) are left out there.
CONSTRAINTS := constraints/test.txt
GPU_STACK := ^(nvidia-|cuda-|cupy|cudf|libcudf|pylibcudf|rmm|librmm|rapidsmpf|librapidsmpf|kvikio|libkvikio|ucx|libucx|rapids-|nvtx|numba|dask|distributed)|-cu[0-9]+==|-cuda[0-9]+x==

.PHONY: run test bench install install-test clean deploy worker constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".$(RUN_EXTRAS)"
	touch $@

# The test install holds everything the run install does, so it stamps both.
$(TEST_STAMP): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(if $(GPU_EXTRA),grep -viE '$(GPU_STACK)',cat) $(CONSTRAINTS) > $(VENV)/constraints.txt
	$(BIN)/python -m pip install -q -c $(VENV)/constraints.txt -e ".[$(TEST_EXTRAS)]"
	touch $@ $(RUN_STAMP)

install: $(RUN_STAMP)

install-test: $(TEST_STAMP)

run: install
	$(BIN)/python -m prefect_cudf_polars.flows.flight_delays $(ARGS)

# Deploy the flows of prefect.yaml to the Prefect API that PREFECT_API_URL names (see the
# README's "Deploy"): registers the block type, saves the engine block, creates the
# process work pool gpu-pool (concurrency limit 1) and runs `prefect --no-prompt deploy --all`.
# Without ENGINE_BACKEND the block is spmd where a GPU backend can run here, else what
# `make run` runs (auto with cpu_fallback).
ENGINE_BLOCK ?= gpu
ENGINE_BACKEND ?=
deploy: install
	$(BIN)/prefect-cudf-polars deploy --engine-block $(ENGINE_BLOCK)$(if $(ENGINE_BACKEND), --backend $(ENGINE_BACKEND))

# On the GPU machine: run the pool's flow runs (one at a time).
worker: install
	$(BIN)/prefect worker start --pool gpu-pool

# Without a GPU the suite runs in TEST_WORKERS processes (pytest-xdist), each test file on
# one of them, so a file's module fixtures (a moto server, a deployment's worker) start
# once; each process has its own local Prefect API. The GPU tests size their data from
# the whole card, so on a GPU machine it runs in this process (TEST_WORKERS=0).
TEST_WORKERS ?= $(if $(GPU_EXTRA),0,2)
test: install-test
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The benchmark harness (benchmarks/README.md), e.g.
#   make bench ARGS="--scale-factors 0.1 --backend cpu --out output/bench"
bench: install-test
	$(BIN)/python -m benchmarks $(ARGS)

# Refresh CONSTRAINTS on purpose (and after changing pyproject.toml's dependencies): the
# newest releases pyproject.toml allows, resolved in a throwaway venv without a GPU (the
# test and check extras); then `make test`.
constraints:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; py="$$tmp/venv/bin/python"; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	$$py -m pip install -q --upgrade pip; \
	$$py -m pip install -q -e ".[test,check]"; \
	{ echo '# The versions `make test` installs (the test and check extras; on a GPU machine the'; \
	  echo '# Makefile leaves out the CUDA, RAPIDS and dask pins). pyproject.toml keeps the ranges.'; \
	  echo "# Written by \`make constraints\` with $$($$py -V)."; \
	  $$py -m pip freeze --exclude-editable; } > "$$tmp/test.txt"; \
	mkdir -p $(dir $(CONSTRAINTS)); mv "$$tmp/test.txt" $(CONSTRAINTS)

clean:
	rm -rf $(VENV) output .pytest_cache
