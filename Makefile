# Two entry points for a fresh machine; each makes .venv and installs what it needs first.
#   make demo  - record 100 episodes of PettingZoo connect four (with action masks) and print a report
#   make test  - run the test suite, a worker a core (what CI runs, with make docs and make package)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test docs package figures bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0   # the local CPU build; never let pip pick a CUDA one
	$(PY) -m pip install -q -e '.[test,torch]'
	# Debian's chromium for the episode browser's test (tests/test_view.py skips it without one)
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "no chromium: the browser test will be skipped"
	touch $@

# into runs/ (ignored by git): each run a new log there, runs/connect_four_v3.log, -2.log, ...
demo: $(VENV)/.installed
	mkdir -p runs && cd runs && $(abspath $(VENV))/bin/flexibuff-envs record

test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto

# the documentation as HTML in docs/_build/html; any warning (a broken reference, a bad
# docstring) fails the build
docs: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[docs]'
	$(VENV)/bin/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html

# a wheel and an sdist in dist/, the wheel installed into a fresh venv, the quickstart run there
package: $(VENV)/.installed
	$(PY) -m pip install -q build
	rm -rf dist .package-venv
	$(PY) -m build -q --outdir dist .
	python3 -m venv .package-venv
	.package-venv/bin/pip install -q dist/*.whl
	cd dist && ../.package-venv/bin/python ../examples/quickstart.py

# the learning examples over seeds 0-2, their results written into docs/examples.md
figures: $(VENV)/.installed
	$(PY) examples/figures.py --seeds 0 1 2

# every benchmark, each one's output written to docs/benchmarks/results/ (benchmarks/run.py),
# then the README's headline figures read out of them
bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'   # the peers compared side by side
	$(PY) benchmarks/run.py bench_record.py
	$(PY) benchmarks/run.py bench_vector.py
	$(PY) benchmarks/run.py bench_sample.py
	$(PY) benchmarks/run.py bench_sample.py --fields
	$(PY) benchmarks/run.py bench_sample.py --frames
	$(PY) benchmarks/run.py bench_pettingzoo.py
	$(PY) benchmarks/run.py bench_gae.py
	$(PY) benchmarks/run.py bench_io.py
	$(PY) benchmarks/run.py bench_io.py --episodes 200000
	$(PY) benchmarks/run.py bench_compress.py
	$(PY) benchmarks/run.py bench_memory.py
	$(PY) benchmarks/run.py bench_per.py
	$(PY) benchmarks/run.py bench_sb3.py
	$(PY) benchmarks/run.py bench_log.py --rounds 5
	$(PY) benchmarks/run.py bench_log_read.py
	$(PY) benchmarks/run.py bench_log_memory.py --steps 10000000
	$(PY) benchmarks/run.py bench_log_memory.py   # 100 million steps: about an hour
	$(PY) benchmarks/run.py bench_exports.py --steps 100000 --frames-mb 1024 --rounds 3
	$(PY) benchmarks/run.py bench_by_agent.py
	$(PY) benchmarks/run.py bench_distributed.py
	$(PY) benchmarks/headline.py   # the README's figures, read out of the outputs above
