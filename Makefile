# The two entry points of the README. Both create .venv when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test lint fuzz bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e . --group dev
	touch $@

# The native gRPC transport (server/native, Rust): built where cargo is installed; without
# it gRPC is served by grpc.aio (grpc_transport auto).
$(VENV)/.native: server/native/Cargo.toml server/native/Cargo.lock $(wildcard server/native/src/*.rs) | $(VENV)/.installed
	@export PATH="$$PATH:$$HOME/.cargo/bin"; \
	if command -v cargo >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet ./server/native && touch $@; \
	else \
		echo "cargo not found: gRPC will be served by grpc.aio; install Rust (rustup) and run make setup again for the native transport"; \
	fi

setup: $(VENV)/.installed $(VENV)/.native

## Train a small demo model on generated data and serve it on 127.0.0.1:8000.
demo: setup
	$(BIN)/tierserve demo

## Lint, then run the native transport's Rust tests (where cargo is installed) and the whole
## test suite; the tests start the services they need.
test: setup
	$(BIN)/ruff check .
	@export PATH="$$PATH:$$HOME/.cargo/bin"; \
	if command -v cargo >/dev/null 2>&1; then cargo test --quiet --manifest-path server/native/Cargo.toml; fi
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

## Fuzz the server's front ends longer than the suite does: schemathesis (every check) over
## the OpenAPI document, Hypothesis over the REST and gRPC decoders and a live server.
FUZZ_EXAMPLES ?= 300
fuzz: setup
	TIERSERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) TIERSERVE_FUZZ_RANDOM=1 $(BIN)/python -m pytest tests/server/test_fuzz.py -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache server/native/target
