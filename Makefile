# The two entry points of the README. Both create .venv when it is missing; every long step
# prints what it does and a line at least every few seconds (clients/make_step.py).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STEP   := $(PYTHON) clients/make_step.py
PIP    := $(BIN)/python -m pip install --progress-bar off
# pip's lines worth showing: one per package fetched, the install, the result
PIP_LINES := --only "^(Collecting|Downloading|Building|Installing|Successfully|ERROR|error)"
# tierserve demo's options, e.g. make demo DEMO_ARGS="--http-port 9000 --exit-after-check"
DEMO_ARGS ?=

.PHONY: setup demo test lint fuzz bench clean

$(BIN)/python:
	@$(STEP) "creating $(VENV)" -- $(PYTHON) -m venv $(VENV)
	@$(STEP) "upgrading pip in $(VENV)" $(PIP_LINES) -- $(PIP) --upgrade "pip>=25.1"

# What the demo needs: tierserve and its dependencies (the README's `pip install -e .`).
$(VENV)/.core: pyproject.toml | $(BIN)/python
	@$(STEP) "installing tierserve into $(VENV) (pip install -e .)" $(PIP_LINES) -- $(PIP) -e .
	@touch $@

# What the tests need besides: the dev group (tests, lint, every extra).
$(VENV)/.installed: pyproject.toml | $(VENV)/.core
	@$(STEP) "installing the dev group (pip install -e . --group dev)" $(PIP_LINES) -- \
		$(PIP) -e . --group dev
	@touch $@

# The native transport (server/native, Rust: gRPC and HTTP/1.1): built where cargo is installed; without
# it gRPC is served by grpc.aio (grpc_transport auto). The demo does not wait for it.
$(VENV)/.native: server/native/Cargo.toml server/native/Cargo.lock $(wildcard server/native/src/*.rs) | $(VENV)/.installed
	@export PATH="$$PATH:$$HOME/.cargo/bin"; \
	if command -v cargo >/dev/null 2>&1; then \
		$(STEP) "building the native transport (Rust; a few minutes the first time)" \
			--only "Compiling|Finished|Successfully|error" -- \
			$(PIP) -v ./server/native && touch $@; \
	else \
		echo "cargo not found: gRPC will be served by grpc.aio; install Rust (rustup) and run make setup again for the native transport"; \
	fi

setup: $(VENV)/.installed $(VENV)/.native

## Train a small demo model on generated data and serve it on 127.0.0.1:8000.
demo: $(VENV)/.core
	$(BIN)/tierserve demo $(DEMO_ARGS)

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
