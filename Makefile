# The two front-door commands: `make demo` (set up + main job) and `make test`.
PY := .venv/bin/python

.PHONY: setup demo quick-demo test coverage lint bench docs
setup:
	bash scripts/setup.sh

# The whole pipeline on configs/demo.yaml: local Ray + MLflow, offline, < 10 min on 2 CPUs.
demo: setup
	$(PY) pipelines/full.py

# Synthetic world only, single process (~4 min): the science without Ray.
quick-demo: setup
	$(PY) -m asymvlm.demo

# The import contracts (pyproject.toml [tool.importlinter]) first: a broken layer fails at once;
# then formatting and lint; then the suite on two workers of one thread each (tests/conftest.py),
# a test file per worker (its module-scoped runs made once; tests/multinode's fixed ports used by
# one worker at a time), handed out longest first (tests/conftest.py's LONGEST_FIRST).
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
test: setup
	.venv/bin/lint-imports
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PYTEST)

# The suite with coverage of asymvlm/ and pipelines/ (subprocesses included).
coverage: setup
	$(PYTEST) --cov --cov-report=term-missing:skip-covered

# The documentation site into site/ (the references are generated from the code); the tests
# build it too. `.venv/bin/mkdocs serve` previews it.
docs: setup
	.venv/bin/mkdocs build --strict

lint:
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	.venv/bin/lint-imports

bench: setup
	$(PY) benchmarks/train_throughput.py
