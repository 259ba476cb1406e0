# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all venv lint test test-fast chaos demo bench-store bench-compare soak check-java clean

all: test

$(STAMP): pyproject.toml setup.py src/dledger/_records.c
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 on PATH; install Python 3.11" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "error: $(PYTHON) is older than Python 3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	@touch $@

venv: $(STAMP)

# Spark (tests, demo) needs a JVM: say so plainly instead of a Py4J stack trace.
check-java:
	@command -v java >/dev/null 2>&1 || { \
		echo "error: 'java' not found. Spark needs Java 17: apt-get install openjdk-17-jre-headless" >&2; \
		exit 1; }
	@java -version 2>&1 | head -n 1 | grep -Eq '"(1[7-9]|2[0-9])' || { \
		echo "error: Spark needs Java 17 or newer; found: $$(java -version 2>&1 | head -n 1)" >&2; exit 1; }

lint: venv
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The full suite as CI runs it, two workers side by side (most tests wait on member processes;
# tests/conftest.py gives each worker its own ports and keeps the Spark tests on one);
# slow soak runs are in `make soak`.
test: lint check-java
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadgroup --durations=25

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not chaos and not sim and not spark and not integration"

# Fault injection on real member processes (short seeded runs; long ones run in `make soak`).
chaos: venv
	$(BIN)/python -m pytest -q -m "chaos and not slow"

demo: venv check-java
	$(BIN)/dledger demo

bench-store: venv
	$(BIN)/python -m dledger.bench.store_bench

# dledger (flush sync/async) side by side with etcd and PySyncObj, 3 members each on 127.0.0.1;
# installs etcd-server/etcd-client (apt-get) and pysyncobj (pip) when missing. Writes the sections
# "Side by side" and "Side by side: the goals" of docs/performance.md, docs/bench-compare.png and
# one chart per goal (docs/goal-*.png); a subset: benchmarks/compare.py --systems "" --goals clients.
bench-compare: venv
	$(BIN)/python benchmarks/compare.py

# Long runs: thousands of simulation seeds, then the slow suites.
soak: venv
	$(BIN)/python -m dledger.sim --seeds $${SIM_SEEDS:-5000} --start 100000
	$(BIN)/python -m dledger.sim --controller --seeds $${SIM_SEEDS:-5000} --start 200000
	$(BIN)/python -m dledger.sim --brokers --seeds $${SIM_SEEDS:-5000} --start 300000
	DLEDGER_SIM_SEEDS=$${SIM_SEEDS:-5000} DLEDGER_SIM_MEMBERSHIP_SEEDS=2000 $(BIN)/python -m pytest -q -n 2 tests/sim
	$(BIN)/python -m pytest -q -m "slow"

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis data
