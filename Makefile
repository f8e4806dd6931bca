# The two front-door commands: `make demo` (set up + main job) and `make test`.
PY := .venv/bin/python

.PHONY: setup demo test lint bench
setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m asymvlm.demo

test: setup
	$(PY) -m pytest -q

lint:
	$(PY) -m ruff check .

bench: setup
	$(PY) benchmarks/train_throughput.py
