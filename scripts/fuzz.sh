#!/usr/bin/env bash
# Coverage-guided fuzzing of llmroute-core on the stable toolchain (`make fuzz`, `make fuzz-smoke`).
#
# Builds filter/core/fuzz (libFuzzer through the libfuzzer-sys crate, compiled by the system C++ compiler) with
# SanitizerCoverage flags that stable rustc accepts, into target/fuzz/, so the normal builds never see them.
# Then runs each target in turn, from its seeds in testdata/fuzz/<target>/ plus the corpus it grew before in
# target/fuzz/corpus/<target>/ (never committed), and prints one line per target and a final table.
# The oracle is Rust's own checks (bounds, integer overflow, debug assertions) and the targets' assertions: any
# panic aborts, and libFuzzer saves the input under target/fuzz/artifacts/<target>/.
#
# Environment:
#   FUZZ_SECONDS  seconds per target (default 60)
#   FUZZ_RUNS     executions per target; with it, a target stops at whichever bound comes first
#   FUZZ_TARGETS  space-separated subset of the targets (default: all)
#   FUZZ_NICE     niceness of the fuzzing processes (default 10)
#   FUZZ_FRESH    1: start from the seeds alone, in a scratch corpus (what `make fuzz-smoke` does, so its time
#                 does not grow with the corpus of earlier runs)
#   FUZZ_RECORD   a Markdown file whose results section (between the fuzz-results markers) is replaced by this
#                 run's dated table, e.g. bench/FUZZING.md
#
# A target's dictionary of tokens (field names, framing, boundary numbers), testdata/fuzz/<target>.dict when it
# exists, helps the mutations reach deeper: the usage overflow needed the boundary numbers.
#
# Exits 1 when a target crashed, or when a binary is not coverage-instrumented.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

ALL_TARGETS="route request_start affinity sse_tracker usage config key_table"
TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}
SECONDS_PER=${FUZZ_SECONDS:-60}
RUNS=${FUZZ_RUNS:-}
NICE=${FUZZ_NICE:-10}
CARGO=${CARGO:-cargo}
OUT=target/fuzz

command -v c++ >/dev/null || {
    echo "fuzz: no C++ compiler (c++): libfuzzer-sys compiles libFuzzer with it; install g++ or clang" >&2
    exit 1
}
HOST=$(rustc -vV | sed -n 's/^host: //p')
# What cargo-fuzz passes for coverage, less the sanitizer (that one needs nightly). An explicit --target keeps
# these flags off build scripts and proc macros.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cforce-frame-pointers=yes"
export CARGO_TARGET_DIR=$OUT

echo "fuzz: building filter/core/fuzz ($HOST, release, coverage-instrumented) into $OUT/"
build_start=$(date +%s)
nice -n "$NICE" "$CARGO" build --quiet --release --locked --manifest-path filter/core/fuzz/Cargo.toml --target "$HOST" --bins
echo "fuzz: built in $(($(date +%s) - build_start)) s"
BIN=$OUT/$HOST/release

limits=(-max_total_time="$SECONDS_PER")
[[ -n $RUNS ]] && limits+=(-runs="$RUNS")
echo "fuzz: each target: ${SECONDS_PER} s${RUNS:+ or $RUNS runs, whichever first}"

rows=()
crashed=0
for t in $TARGETS; do
    [[ -x $BIN/$t ]] || {
        echo "fuzz: no target named $t (targets: $ALL_TARGETS)" >&2
        exit 1
    }
    corpus=$OUT/corpus/$t
    if [[ ${FUZZ_FRESH:-} == 1 ]]; then
        corpus=$OUT/smoke-corpus/$t
        rm -rf "$corpus"
    fi
    artifacts=$OUT/artifacts/$t
    log=$OUT/logs/$t.log
    [[ ${FUZZ_FRESH:-} == 1 ]] && log=$OUT/smoke-logs/$t.log
    mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
    seeds=()
    [[ -d testdata/fuzz/$t ]] && seeds=("testdata/fuzz/$t")
    dict=()
    [[ -f testdata/fuzz/$t.dict ]] && dict=(-dict="testdata/fuzz/$t.dict")
    start=$(date +%s%N)
    rc=0
    # New inputs go to the first directory only, so the seeds stay as committed.
    nice -n "$NICE" "$BIN/$t" "$corpus" "${seeds[@]}" "${dict[@]}" "${limits[@]}" -print_final_stats=1 -timeout=10 \
        -rss_limit_mb=2048 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
    took_ms=$((($(date +%s%N) - start) / 1000000))
    took=$(awk -v ms="$took_ms" 'BEGIN { printf "%.1f", ms / 1000 }')
    counters=$(grep -oE 'Loaded [0-9]+ modules +\([0-9]+ inline 8-bit counters' "$log" | grep -oE '\([0-9]+' | tr -d '(' | head -1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [[ -z $runs ]] && runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    # Over the whole run, seeds and start-up included (libFuzzer's own figure is whole seconds only).
    rate=$(awk -v n="${runs:-0}" -v ms="$took_ms" 'BEGIN { printf "%d", (ms > 0 ? n * 1000 / ms : 0) }')
    cov=$(grep -oE ' cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    ft=$(grep -oE ' ft: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    inputs=$(find "$corpus" -type f | wc -l)
    if ((rc != 0)); then
        artifact=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -1 | sed 's/Test unit written to //')
        result="CRASH ${artifact:-(no artifact; see $log)}"
        crashed=1
    elif [[ -z $counters || $counters == 0 ]]; then
        result="NOT INSTRUMENTED (no inline 8-bit counters)"
        crashed=1
    else
        result=ok
    fi
    printf 'fuzz: %-13s runs=%-10s exec/s=%-8s cov=%-6s ft=%-6s counters=%-6s corpus=%-5s time=%ss result=%s\n' \
        "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${counters:-0}" "$inputs" "$took" "$result"
    rows+=("| \`$t\` | ${runs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${counters:-0} | $inputs | $took | $result |")
    if [[ $result != ok ]]; then
        grep -E 'panicked|ERROR|deadly signal|SUMMARY' "$log" | head -5 | sed 's/^/fuzz:   /' >&2 || true
    fi
done

table=$(
    echo "| target | executions | exec/s | cov (edges) | ft (features) | counters | corpus | seconds | result |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    printf '%s\n' "${rows[@]}"
)
echo
echo "$table"

if [[ -n ${FUZZ_RECORD:-} ]]; then
    section=$(
        echo "Run of $(date -u +%Y-%m-%d) (UTC), \`$(rustc --version)\`, $(nproc) CPU(s), limits: ${SECONDS_PER} s per target${RUNS:+ or $RUNS executions, whichever came first}."
        echo
        echo "$table"
    )
    begin='<!-- fuzz-results:begin -->'
    end='<!-- fuzz-results:end -->'
    if grep -qF "$begin" "$FUZZ_RECORD" && grep -qF "$end" "$FUZZ_RECORD"; then
        SECTION=$section awk -v b="$begin" -v e="$end" '
            $0 == b { print; print ENVIRON["SECTION"]; skip = 1; next }
            $0 == e { skip = 0 }
            !skip' "$FUZZ_RECORD" >"$FUZZ_RECORD.tmp"
        mv "$FUZZ_RECORD.tmp" "$FUZZ_RECORD"
        echo "fuzz: results written to $FUZZ_RECORD"
    else
        echo "fuzz: $FUZZ_RECORD has no $begin ... $end section; results not written" >&2
    fi
fi

if ((crashed)); then
    echo "fuzz: FAILED: see the logs in $OUT/logs/ and the inputs in $OUT/artifacts/" >&2
    exit 1
fi
echo "fuzz: ok: no crash"
