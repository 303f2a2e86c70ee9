#!/usr/bin/env bash
# Checks that the hand-written docs name only things that exist (`make docs-check`, part of `make test`):
#   - every backticked repository path (`filter/core/src/route.rs`, `testdata/configs/bad-*.yaml`) exists;
#     a path counts when its first segment is a top-level entry of the repository (build outputs under
#     target/ and .tools/ are not checked);
#   - every backticked or fenced `make TARGET` names a target of the Makefile;
#   - every relative Markdown link points at a file that exists, and its #anchor at a heading of that file.
# Pages: README.md, docs/*.md, bench/README.md and the hand-written bench pages (bench/OVERHEAD.md, PLACEMENT.md,
# REPLICAS.md).
# The bench figures (bench/RESULTS.md, ROUTING.md, ENGINES.md, CHAOS.md, FUZZING.md) are written by the runs and
# not checked here.
#
# Prints one line per problem and a summary; exits 1 when any check failed. Needs only bash, grep, sed and awk.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

shopt -s nullglob
PAGES=()
for page in README.md docs/*.md bench/README.md bench/OVERHEAD.md bench/PLACEMENT.md bench/REPLICAS.md; do [[ -f $page ]] && PAGES+=("$page"); done
# Top-level entries of the repository (outside a git checkout, of the directory, less the build outputs).
TOP=$({ git ls-files 2>/dev/null || ls -A; } | cut -d/ -f1 | grep -vxE 'target|\.tools|\.git' | sort -u; echo docs)
TARGETS=$(grep -hoE '^[a-zA-Z0-9_-]+:' Makefile | tr -d ':' | sort -u)

problems=0
checked=0
fail() {
    echo "docs-check: $1: $2" >&2
    problems=$((problems + 1))
}

# GitHub's anchor for a heading: lower case, backticks and punctuation dropped, spaces to hyphens.
slugs() {
    awk '/^```/ { code = !code; next } !code && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
        tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}

# Text inside single backticks, one span a line, fenced blocks left out.
spans() {
    awk '/^```/ { code = !code; next } !code' "$1" | grep -oE '`[^`]+`' | tr -d '`' || true
}

check_path() {
    local page=$1 token=$2 first
    token=${token%%:[0-9]*}        # file.rs:12
    token=${token%[.,;)]}
    [[ $token =~ ^[A-Za-z0-9_.*/-]+$ ]] || return 0
    first=${token%%/*}
    if [[ $token != */* ]]; then
        # A bare top-level file (Makefile, LICENSE); bare words are not paths.
        [[ -f $token ]] && checked=$((checked + 1))
        return 0
    fi
    grep -qxF -- "$first" <<<"$TOP" || return 0
    checked=$((checked + 1))
    if [[ $token == *'*'* ]]; then
        compgen -G "$token" >/dev/null || fail "$page" "\`$token\` matches no file"
    elif [[ ! -e $token ]]; then
        fail "$page" "\`$token\` does not exist"
    fi
}

check_make() {
    local page=$1 target=$2
    checked=$((checked + 1))
    grep -qxF -- "$target" <<<"$TARGETS" || fail "$page" "\`make $target\`: no such Makefile target"
}

check_link() {
    local page=$1 link=$2 dir file anchor
    case $link in
    http://* | https://* | mailto:*) return 0 ;;
    esac
    checked=$((checked + 1))
    dir=$(dirname "$page")
    file=${link%%#*}
    anchor=
    [[ $link == *'#'* ]] && anchor=${link#*#}
    if [[ -z $file ]]; then
        file=$page
    else
        file=$(realpath -m --relative-to=. "$dir/$file")
    fi
    if [[ ! -e $file ]]; then
        fail "$page" "link ($link): $file does not exist"
        return 0
    fi
    if [[ -n $anchor && -f $file ]] && ! slugs "$file" | grep -qxF -- "$anchor"; then
        fail "$page" "link ($link): no heading with anchor #$anchor in $file"
    fi
}

for page in "${PAGES[@]}"; do
    while IFS= read -r span; do
        if [[ $span =~ (^|[[:space:]])make[[:space:]]+([a-z][a-z0-9-]*) ]]; then
            check_make "$page" "${BASH_REMATCH[2]}"
        elif [[ $span != *[[:space:]]* ]]; then
            check_path "$page" "$span"
        fi
    done < <(spans "$page")
    while IFS= read -r target; do
        check_make "$page" "$target"
    done < <(awk '/^```/ { code = !code; next } code' "$page" |
        grep -oE '(^|[[:space:]])make[[:space:]]+[a-z][a-z0-9-]*' | awk '{ print $2 }' || true)
    while IFS= read -r link; do
        check_link "$page" "$link"
    done < <(awk '/^```/ { code = !code; next } !code' "$page" |
        grep -oE '\]\([^) ]+\)' | sed -e 's/^](//' -e 's/)$//' || true)
done

if ((problems > 0)); then
    echo "docs-check: $problems problem(s) in ${#PAGES[@]} page(s)" >&2
    exit 1
fi
echo "docs-check: ok: ${#PAGES[@]} page(s), $checked path(s), target(s) and link(s)"
