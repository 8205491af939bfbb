# Two entry points for a fresh machine; each makes .venv and installs what it needs first.
#   make demo  - record 100 episodes of PettingZoo connect four (with action masks) and print a report
#   make test  - run the test suite (exactly what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0   # the local CPU build; never let pip pick a CUDA one
	$(PY) -m pip install -q -e '.[test,torch]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/flexibuff-envs record

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'   # the peers compared side by side
	$(PY) benchmarks/bench_record.py
	$(PY) benchmarks/bench_vector.py
	$(PY) benchmarks/bench_sample.py
	$(PY) benchmarks/bench_sample.py --fields
	$(PY) benchmarks/bench_pettingzoo.py
	$(PY) benchmarks/bench_gae.py
	$(PY) benchmarks/bench_io.py
	$(PY) benchmarks/bench_memory.py
	$(PY) benchmarks/bench_per.py
	$(PY) benchmarks/bench_sb3.py
	$(PY) benchmarks/bench_log.py
	$(PY) benchmarks/bench_log_read.py
	$(PY) benchmarks/bench_log_memory.py
	$(PY) benchmarks/bench_exports.py
	$(PY) benchmarks/bench_by_agent.py
