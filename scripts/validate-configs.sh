#!/usr/bin/env bash
# Checks the config fixtures in testdata/configs/ end to end:
#   good-*  `llmroute validate` exits 0, and the bootstrap `llmroute render` writes passes `envoy --mode validate`;
#   bad-*   `llmroute validate` exits 1, and its output holds every substring of the file's first line,
#           `# expect: SUBSTRING[ && SUBSTRING...]`.
# envoy/llmroute.yaml, when present, is checked like a good fixture.
# testdata/envoy/handwritten.yaml, an Envoy config written by hand, gets the `--target filter` sections of
# testdata/envoy/llmroute.yaml pasted in (`--paste-into`) and must pass `envoy --mode validate`.
#
# Needs `make build cli envoy` first (`make validate-configs` does both). Prints one line per file and a summary;
# exits non-zero when any check failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CLI=target/release/llmroute
WASM="$PWD/target/wasm32-wasip1/release/llmroute_filter.wasm"
ENVOY=${LLMROUTE_ENVOY:-.tools/bin/envoy}
CONFIGS=testdata/configs

for need in "$CLI" "$WASM" "$ENVOY"; do
    if [[ ! -e "$need" ]]; then
        echo "validate-configs: $need is missing; run \`make build cli envoy\` first" >&2
        exit 2
    fi
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/llmroute-validate-configs.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0

ok() {
    printf 'ok   %s\n' "$1"
    passed=$((passed + 1))
}

fail() {
    printf 'FAIL %s: %s\n' "$1" "$2"
    failed=$((failed + 1))
}

# Prints its input indented, so a tool's output stands apart from the per-file lines.
indent() {
    sed 's/^/    | /'
}

check_good() {
    local path=$1 name out rc rendered
    name=${path#"$CONFIGS/"}
    out=$("$CLI" validate "$path" 2>&1) && rc=0 || rc=$?
    if [[ $rc -ne 0 ]]; then
        fail "$name" "llmroute validate exited $rc"
        indent <<<"$out"
        return
    fi
    rendered="$TMP/${name//\//_}.envoy.yaml"
    out=$("$CLI" render "$path" --wasm "$WASM" -o "$rendered" 2>&1) && rc=0 || rc=$?
    if [[ $rc -ne 0 ]]; then
        fail "$name" "llmroute render exited $rc"
        indent <<<"$out"
        return
    fi
    # Envoy refuses a bootstrap whose `credential_env` variable is unset: give each a placeholder for this check.
    creds=()
    while read -r var; do creds+=("$var=validate-configs-placeholder"); done < <(
        grep -oE 'credential_env"?: *"?[A-Za-z_][A-Za-z0-9_]*' "$path" | sed -E 's/.*[: "]//' || true)
    # The filter refuses to start without the placement store's etcd password (`auth.password_env`): a placeholder.
    while read -r var; do creds+=("$var=validate-configs-placeholder"); done < <(
        grep -oE 'password_env"?: *"?[A-Za-z_][A-Za-z0-9_]*' "$path" | sed -E 's/.*[: "]//' || true)
    # The filter refuses to start without its API keys (`auth.keys_env`): give it one placeholder `name:token`.
    while read -r var; do creds+=("$var=validate:validate-configs-placeholder"); done < <(
        grep -oE 'keys_env"?: *"?[A-Za-z_][A-Za-z0-9_]*' "$path" | sed -E 's/.*[: "]//' || true)
    out=$(env "${creds[@]}" "$ENVOY" --mode validate -c "$rendered" 2>&1) && rc=0 || rc=$?
    if [[ $rc -ne 0 ]]; then
        fail "$name" "envoy --mode validate rejected the rendered bootstrap (exit $rc)"
        indent <<<"$out"
        return
    fi
    ok "$name"
}

check_bad() {
    local path=$1 name first expect out rc first_error missing=() s
    name=${path#"$CONFIGS/"}
    IFS= read -r first <"$path" || true
    if [[ $first != "# expect: "* ]]; then
        fail "$name" "first line must be \`# expect: SUBSTRING[ && SUBSTRING...]\`"
        return
    fi
    expect=${first#"# expect: "}
    out=$("$CLI" validate "$path" 2>&1) && rc=0 || rc=$?
    if [[ $rc -ne 1 ]]; then
        fail "$name" "llmroute validate exited $rc, expected 1 (the config was not rejected)"
        indent <<<"$out"
        return
    fi
    # Split on the literal separator ` && `.
    while [[ -n $expect ]]; do
        if [[ $expect == *" && "* ]]; then
            s=${expect%%" && "*}
            expect=${expect#*" && "}
        else
            s=$expect
            expect=
        fi
        [[ $out == *"$s"* ]] || missing+=("$s")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        fail "$name" "output lacks: $(printf '[%s] ' "${missing[@]}")"
        indent <<<"$out"
        return
    fi
    # The first error is the first indented line; otherwise (an I/O error, say) the first line.
    first_error=$(grep -m1 '^  ' <<<"$out" || head -n1 <<<"$out")
    first_error=${first_error#"${first_error%%[![:space:]]*}"}
    ok "$name (rejected: $first_error)"
}

shopt -s nullglob
goods=("$CONFIGS"/good-*)
bads=("$CONFIGS"/bad-*)
shopt -u nullglob
[[ -f envoy/llmroute.yaml ]] && goods+=(envoy/llmroute.yaml)

if [[ ${#goods[@]} -eq 0 && ${#bads[@]} -eq 0 ]]; then
    echo "validate-configs: no fixtures in $CONFIGS" >&2
    exit 2
fi

for f in "${goods[@]}"; do check_good "$f"; done
for f in "${bads[@]}"; do check_bad "$f"; done

# The shipped envoy/envoy.yaml (for your own Envoy) must be exactly what `make render`
# writes from envoy/llmroute.yaml, and must pass `envoy --mode validate` (the container wasm path is swapped for
# the local build so Envoy can load it).
if [[ -f envoy/envoy.yaml ]]; then
    "$CLI" render envoy/llmroute.yaml --wasm /etc/envoy/llmroute_filter.wasm -o "$TMP/shipped.yaml"
    if ! diff -q "$TMP/shipped.yaml" envoy/envoy.yaml >/dev/null; then
        fail envoy/envoy.yaml "stale: run \`make render\` and commit the result"
    else
        sed "s#/etc/envoy/llmroute_filter.wasm#$WASM#" envoy/envoy.yaml >"$TMP/shipped-local.yaml"
        out=$("$ENVOY" --mode validate -c "$TMP/shipped-local.yaml" 2>&1) && rc=0 || rc=$?
        if [[ $rc -ne 0 ]]; then
            fail envoy/envoy.yaml "envoy --mode validate rejected it (exit $rc)"
            indent <<<"$out"
        else
            ok envoy/envoy.yaml
        fi
    fi
fi

# The hand-written config, built only from its own skeleton and the pasted sections. Its port placeholders get the
# ports of testdata/envoy/llmroute.yaml.
if [[ -f testdata/envoy/handwritten.yaml ]]; then
    sed -e 's/${LISTEN_PORT}/10000/g' -e 's/${ADMIN_PORT}/9901/g' testdata/envoy/handwritten.yaml >"$TMP/template.yaml"
    out=$("$CLI" render testdata/envoy/llmroute.yaml --target filter --wasm "$WASM" \
        --paste-into "$TMP/template.yaml" -o "$TMP/handwritten.yaml" 2>&1) && rc=0 || rc=$?
    if [[ $rc -ne 0 ]]; then
        fail testdata/envoy/handwritten.yaml "llmroute render --paste-into exited $rc"
        indent <<<"$out"
    else
        out=$("$ENVOY" --mode validate -c "$TMP/handwritten.yaml" 2>&1) && rc=0 || rc=$?
        if [[ $rc -ne 0 ]]; then
            fail testdata/envoy/handwritten.yaml "envoy --mode validate rejected it with the sections pasted (exit $rc)"
            indent <<<"$out"
        else
            ok "testdata/envoy/handwritten.yaml (sections of testdata/envoy/llmroute.yaml pasted in)"
        fi
    fi
fi

echo "validate-configs: $((passed + failed)) config(s): $passed ok, $failed failed"
[[ $failed -eq 0 ]]
