#!/usr/bin/env bash
# Library code never ends the process (issue 10): only tools/ decides to exit
# or abort. Usage: check_no_exit.sh SOURCE_ROOT LIB...
# Checks the sources of src/ and mpi/ for calls of exit, _exit, _Exit,
# quick_exit, abort and MPI_Abort, and the built libraries for references to
# those functions (which also catches calls hidden behind macros).
set -euo pipefail
root=$1
shift
bad=0
calls='\b(exit|_exit|_Exit|quick_exit|abort|MPI_Abort)[[:space:]]*\('
if hits=$(grep -rnE "$calls" "$root/src" "$root/mpi" --include='*.c' --include='*.h'); then
    echo "library code that ends the process:" >&2
    echo "$hits" >&2
    bad=1
fi
for lib in "$@"; do
    refs=$(nm -u "$lib" | awk '{print $2}' | grep -x -e exit -e _exit -e _Exit -e quick_exit -e abort -e MPI_Abort | sort -u || true)
    if [ -n "$refs" ]; then
        echo "$(basename "$lib") calls: $(echo $refs)" >&2
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "no exit, _exit, abort or MPI_Abort in src/, mpi/ or $# libraries"
exit $bad
