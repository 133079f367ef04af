# laggard — `make demo` and `make test` work from a clean clone with nothing installed by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.base-installed
FULL := $(VENV)/.full-installed
DEMO_TRACE ?= traces/gpu-straggler

.PHONY: setup setup-full system-deps demo test lint bench clean traces

$(BASE): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(BASE)

# everything the tests need: torch (CPU build, pinned), the local LLM server, Dask, linters
$(FULL): $(BASE)
	$(BIN)/python -m pip install -q -e ".[dev,torch,llm,cluster]"
	touch $(FULL)

setup: $(BASE)
setup-full: $(FULL) system-deps

# packet capture, namespaces and a headless browser for the real-system tests (root, Debian)
system-deps:
	@missing=""; \
	for c in tcpdump:tcpdump tshark:tshark ip:iproute2 chromium:chromium tc:iproute2; do \
	  command -v $${c%%:*} >/dev/null 2>&1 || missing="$$missing $${c##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

demo: $(BASE)
	$(BIN)/laggard timeline $(DEMO_TRACE)
	$(BIN)/laggard localize $(DEMO_TRACE)

lint: $(FULL)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup-full lint
	$(BIN)/python -m pytest

bench: $(FULL)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

traces: $(BASE)
	LAGGARD=$(BIN)/laggard bash traces/regenerate.sh
