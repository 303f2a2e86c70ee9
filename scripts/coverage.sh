#!/usr/bin/env bash
# Line coverage of the filter's glue (filter/src) by its native tests (`make coverage`; docs/testing.md).
#
# Builds `cargo test -p llmroute-filter --lib` with `-C instrument-coverage` in its own target directory
# (target/coverage, so the normal builds stay as they are), runs it, merges the profiles with the toolchain's
# llvm-profdata and reports with its llvm-cov (rustup component llvm-tools-preview, added here when missing).
# Test code (filter/src/tests/, host/fake.rs, host/tests.rs, host/sdk_imports.rs) is left out of the figures.
# Prints the per-file table and writes it to bench/COVERAGE.md (COVERAGE_OUT to change).
#
# About 2 minutes the first time on 2 cores (every dependency is built instrumented), seconds after.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CARGO=${CARGO:-cargo}
OUT=${COVERAGE_OUT:-bench/COVERAGE.md}
DIR=target/coverage

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
bin="$sysroot/lib/rustlib/$host/bin"
if [[ ! -x $bin/llvm-profdata || ! -x $bin/llvm-cov ]]; then
    rustup component add llvm-tools-preview
fi

rm -rf "$DIR/profiles"
mkdir -p "$DIR/profiles"
export RUSTFLAGS="-C instrument-coverage"
export CARGO_TARGET_DIR=$DIR
export LLVM_PROFILE_FILE="$PWD/$DIR/profiles/%p-%m.profraw"
$CARGO test -p llmroute-filter --lib --quiet
exe=$($CARGO test -p llmroute-filter --lib --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
"$bin/llvm-profdata" merge -sparse "$DIR"/profiles/*.profraw -o "$DIR/filter.profdata"

ignore='(/\.cargo/|/rustc/|filter/core/|filter/src/tests/|filter/src/host/(fake|tests|sdk_imports)\.rs)'
"$bin/llvm-cov" export -summary-only -instr-profile="$DIR/filter.profdata" -ignore-filename-regex="$ignore" "$exe" |
    python3 -c '
import json, os, sys
root = os.getcwd() + "/"
files = json.load(sys.stdin)["data"][0]["files"]
rows = []
for f in files:
    name = f["filename"].replace(root, "")
    if not name.startswith("filter/src/"):
        continue
    l = f["summary"]["lines"]
    rows.append((name, l["count"], l["count"] - l["covered"], l["percent"]))
rows.sort()
total = sum(r[1] for r in rows)
missed = sum(r[2] for r in rows)
print("| file | lines | not run | line coverage |")
print("|---|---:|---:|---:|")
for name, count, miss, pct in rows:
    print(f"| `{name}` | {count} | {miss} | {pct:.1f} % |")
pct = 100.0 * (total - missed) / total if total else 0.0
print(f"| **all of filter/src** | {total} | {missed} | {pct:.1f} % |")
' > "$DIR/table.md"

{
    echo "# Coverage of the filter's glue by native tests"
    echo
    echo "Written by \`make coverage\` (\`scripts/coverage.sh\`) on $(date -u +%Y-%m-%d), $(rustc --version | cut -d' ' -f1-2)."
    echo "Lines of \`filter/src\` run by \`cargo test -p llmroute-filter --lib\` on the fake host (test code left out)."
    echo "How to read it and what the Envoy tests cover instead: [docs/testing.md](../docs/testing.md#coverage-of-the-glue)."
    echo
    cat "$DIR/table.md"
} > "$OUT"
cat "$DIR/table.md"
echo "coverage: written to $OUT"
