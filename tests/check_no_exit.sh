#!/usr/bin/env bash
# Library code never ends the process (issue 10): only tools/ decides to exit
# or abort. Usage: check_no_exit.sh SOURCE_ROOT LIB...
# Checks the sources of src/ and mpi/ for calls of exit, _exit, _Exit,
# quick_exit, abort and MPI_Abort, and the built libraries for references to
# those functions (which also catches calls hidden behind macros).
# One exception: _exit in src/sandbox/sandbox_launch.c, where a forked child that
# could not start bwrap ends itself (it is not the caller's process; exec or
# _exit are the only ways out of a child of a threaded process).
set -euo pipefail
root=$1
shift
bad=0
calls='\b(exit|_exit|_Exit|quick_exit|abort|MPI_Abort)[[:space:]]*\('
sandbox_child='^[^:]*/src/sandbox/sandbox_launch\.c:[0-9]+:.*\b_exit\(SANDBOX_EXEC_FAILED\)'
if hits=$(grep -rnE "$calls" "$root/src" "$root/mpi" --include='*.c' --include='*.h' | grep -vE "$sandbox_child"); then
    echo "library code that ends the process:" >&2
    echo "$hits" >&2
    bad=1
fi
for lib in "$@"; do
    # nm -A: "lib.a:object.o: U symbol"; the sandbox object may reference _exit (above)
    refs=$(nm -A -u "$lib" | grep -v -E 'src_sandbox_sandbox_launch\.c\.o: +U _exit$' | awk '{print $NF}' |
        grep -x -e exit -e _exit -e _Exit -e quick_exit -e abort -e MPI_Abort | sort -u || true)
    if [ -n "$refs" ]; then
        echo "$(basename "$lib") calls: $(echo $refs)" >&2
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "no exit, _exit, abort or MPI_Abort in src/, mpi/ or $# libraries"
exit $bad
