# The two commands in the README: `make demo` (the demo sweep) and `make test` (the test suite).
# Both create the virtual environment on first use; nothing else needs installing by hand.
# The editable install maps conf/, models/ and data/ to packages of other names, so setuptools installs
# it through an import finder and says so ("Editable installation. Please be careful with folders ...");
# that note asks nothing of a user and is silenced by its own text, no other warning with it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.parasweep-installed
SOURCES := analysis orchestrator simulator vocab workloads hydra_plugins run.py

.PHONY: setup demo test test-fast lint clean-runs

# The install goes through uv (bootstrapped from pip): the same pinned versions in less than half of
# pip's time (docs/testing.md). It compiles the installed modules, as pip does: where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile what it imports (MLflow, Ray,
# pandas ...) again, and the suite starts hundreds. Where uv cannot be bootstrapped or cannot install
# (no wheel of it for the platform, an index only pip is configured for), pip does it instead.
# The bootstrap is quieter still (-qq: errors only): a machine whose pip configuration names extra
# file indexes without pip or uv in them gets one warning per such index and package, which asks
# nothing of the user.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	($(PY) -m pip install -qq --upgrade pip uv \
		&& PYTHONWARNINGS="ignore:Editable installation" $(PY) -m uv pip install --quiet \
			--compile-bytecode --python $(PY) -e ".[dev]") \
		|| PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) run.py -m pp.async_depth=0,4,8,16

# Tests run in parallel (pytest-xdist): much of the suite waits on real processes (engines, Ray, MLflow),
# so three workers fit two cores. The full suite goes module by module (--dist loadscope: two CPU-heavy
# tests of one module never overlap, a module's fixtures are made once); the fast tier test by test,
# keeping modules with a shared fixture together (loadgroup, tests/conftest.py). docs/testing.md.
# The project's modules are compiled first:
# where PYTHONDONTWRITEBYTECODE is set, every process the suite starts would compile them again. For the
# same reason pytest runs with it cleared: pytest rewrites each test module's asserts on import (about
# 4 s of CPU for all of them, in every xdist worker) and keeps the result only where it may write
# bytecode; once kept, later runs read it back.
test: $(STAMP)
	$(PY) -m compileall -q -j 0 $(SOURCES)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 3 --dist loadscope --no-loadscope-reorder

# The fast tier: unit and contract tests, no Ray, no engine or server processes (run after every change).
test-fast: $(STAMP)
	$(PY) -m compileall -q -j 0 $(SOURCES)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -m "not slow" -q -n 3 --dist loadgroup --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/vulture

clean-runs:
	rm -rf runs/mlflow.db runs/artifacts runs/multirun runs/outputs
