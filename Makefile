# Two commands for a fresh machine:
#   make demo   set up the main stack and run the demo
#   make test   set up both stacks and run every test on each
SHELL := /bin/bash
PYTHON_MAIN ?= python3
PYTHON_COMPAT ?= $(shell pyenv root 2>/dev/null)/versions/3.10.13/bin/python3
UV ?= $(shell command -v uv 2>/dev/null || echo "$(PYTHON_MAIN) -m uv")
MAIN := .venv
COMPAT := .venv-compat
PYTEST_FLAGS ?= -q -p no:cacheprovider

.PHONY: demo test lint test-main test-compat setup setup-main setup-compat build bench clean tfx-example

demo: setup-main
	$(MAIN)/bin/intune demo

test: lint test-main test-compat

# ruff, configured in pyproject.toml (Google style).
lint: setup-main
	$(MAIN)/bin/ruff check --no-cache .

test-main: setup-main
	$(MAIN)/bin/pytest $(PYTEST_FLAGS) tests

# The compat stack installs the package (not editable): the source tree holds
# the main stack's kernel library, built for another TensorFlow.
test-compat: setup-compat
	$(COMPAT)/bin/pytest $(PYTEST_FLAGS) tests

uv:
	@command -v uv >/dev/null 2>&1 || $(PYTHON_MAIN) -m uv --version >/dev/null 2>&1 || \
	  $(PYTHON_MAIN) -m pip install -q uv

$(MAIN)/.deps: requirements/main.txt | uv
	$(UV) venv -q --allow-existing -p $(PYTHON_MAIN) $(MAIN)
	VIRTUAL_ENV=$(MAIN) $(UV) pip install -q -r requirements/main.txt
	touch $@

$(COMPAT)/.deps: requirements/compat.txt | uv
	@test -x "$(PYTHON_COMPAT)" || { echo "Python 3.10 not found at $(PYTHON_COMPAT): set PYTHON_COMPAT"; exit 1; }
	$(UV) venv -q --allow-existing -p $(PYTHON_COMPAT) $(COMPAT)
	VIRTUAL_ENV=$(COMPAT) $(UV) pip install -q -r requirements/compat.txt
	touch $@

setup: setup-main setup-compat

# Builds the kernel library against the main stack's TensorFlow (in place).
setup-main build: $(MAIN)/.deps
	VIRTUAL_ENV=$(MAIN) $(UV) pip install -q --no-build-isolation -e .

setup-compat: $(COMPAT)/.deps
	VIRTUAL_ENV=$(COMPAT) $(UV) pip install -q --no-build-isolation --reinstall-package intune-tf .

bench: setup-main
	$(MAIN)/bin/python benchmarks/live_control.py
	$(MAIN)/bin/python benchmarks/guard.py
	$(MAIN)/bin/python benchmarks/overhead.py

# The TFX example pipeline on the compat stack (docs/tfx.md): Criteo sample ->
# ImportExampleGen -> IntuneTuner -> Trainer (DLRM), LocalDagRunner + MLMD.
TFX_EXAMPLE_OUT ?= /tmp/intune-tfx-example
tfx-example: setup-compat
	$(COMPAT)/bin/python examples/tfx_pipeline/pipeline.py --out $(TFX_EXAMPLE_OUT)

clean:
	rm -rf build intune_tf/ops/_intune_ops.so intune_tf/ops/_intune_ops.tfversion *.egg-info
