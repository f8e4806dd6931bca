# The two front-door commands: `make demo` (set up + main job) and `make test`.
PY := .venv/bin/python

.PHONY: setup demo quick-demo test lint bench docs
setup:
	bash scripts/setup.sh

# The whole pipeline on configs/demo.yaml: local Ray + MLflow, offline, < 10 min on 2 CPUs.
demo: setup
	$(PY) pipelines/full.py

# Synthetic world only, single process (~4 min): the science without Ray.
quick-demo: setup
	$(PY) -m asymvlm.demo

# The import contracts (pyproject.toml [tool.importlinter]) first: a broken layer fails at once.
test: setup
	.venv/bin/lint-imports
	$(PY) -m pytest -q

# The documentation site into site/ (the references are generated from the code); the tests
# build it too. `.venv/bin/mkdocs serve` previews it.
docs: setup
	.venv/bin/mkdocs build --strict

lint:
	$(PY) -m ruff check .
	.venv/bin/lint-imports

bench: setup
	$(PY) benchmarks/train_throughput.py
