# The two set-up commands of the README: `make demo` (the main job) and `make test` (the tests).
# Both create .venv on first use: torch 2.13.0 (the CPU build on a machine without CUDA), the lab and its dependencies.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/lab: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch 2.13.0 is a local CPU wheel here (find-links /opt/wheels); elsewhere pip takes the registry's build.
	$(BIN)/pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels) "torch==2.13.0" || $(BIN)/pip install -q torch
	$(BIN)/pip install -q -e ".[test,upstream]"
	# torchao for the tests of `--setting quantized`, in a folder of its own that only those tests put on PYTHONPATH:
	# in the lab's environment every diffusers import would print its noise (its extensions do not load on this torch)
	$(BIN)/pip install -q --no-deps --target $(VENV)/torchao "torchao==0.18.0"
	touch $(BIN)/lab

.PHONY: demo test test-fast
demo: $(BIN)/lab  ## the main job: A/B of unipc_stack on Wan (tiny on a CPU-only machine, full size on CUDA)
	$(BIN)/lab ab --fix unipc_stack --pipeline wan --out out/ab --trace-dir out/traces --replace

test: $(BIN)/lab  ## the test suite (CPU)
	$(BIN)/python -m pytest -q tests

test-fast: $(BIN)/lab  ## the suite without the tests marked slow (subprocesses, campaigns, compiles): a quick check while editing
	$(BIN)/python -m pytest -q -m "not slow" tests
