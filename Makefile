# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all venv lint test test-fast demo bench-store soak check-java clean

all: test

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 on PATH; install Python 3.11" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "error: $(PYTHON) is older than Python 3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { \
		echo "error: 'java' not found. Spark needs Java 17: apt-get install openjdk-17-jre-headless" >&2; \
		exit 1; }

lint: venv
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The full suite as CI runs it; slow soak runs are in `make soak`.
test: lint
	$(BIN)/python -m pytest -q -m "not slow"

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not chaos and not sim and not spark and not integration"

demo: venv
	$(BIN)/dledger demo

bench-store: venv
	$(BIN)/python -m dledger.bench.store_bench

# Long runs: thousands of simulation seeds, then the slow suites.
soak: venv
	$(BIN)/python -m dledger.sim --seeds $${SIM_SEEDS:-5000} --start 100000
	$(BIN)/python -m pytest -q -m "slow"

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis data
