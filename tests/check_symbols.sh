#!/usr/bin/env bash
# Every external symbol of the vkswarm libraries starts with vks_ (issue 10):
# lists the defined globals of each static library given and fails on others.
set -euo pipefail
bad=0
for lib in "$@"; do
    # names starting with __ are the compiler's (e.g. ASan's __odr_asan.*)
    others=$(nm -g --defined-only "$lib" | awk '$2 ~ /^[TDBRCGSV]$/ {print $3}' | grep -v -e '^vks_' -e '^__' | sort -u || true)
    if [ -n "$others" ]; then
        echo "$(basename "$lib"): external symbols without the vks_ prefix: $(echo $others)" >&2
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "symbols: every external symbol of $# libraries starts with vks_"
exit $bad
