#!/usr/bin/env bash
# Layers call downward only (issue 24). Usage: check_layers.sh SOURCE_ROOT LIBVKS LIBVKS_MPI
#  - a file of src/F includes only its own folder's private headers and the
#    public headers (include/vkswarm) of F's layer or a lower one; a public
#    header includes only headers of its layer or lower ones;
#  - mpi/ and tools/ include only public headers and their own;
#  - no object of src/F in LIBVKS calls a function of a higher layer, and
#    LIBVKS calls nothing of LIBVKS_MPI.
# docs/tests.md ("Layout") shows the same order.
set -euo pipefail
root=$1
libvks=$2
libmpi=$3

# The folders of src/, lowest first: each may use itself and those before it.
# mpi/, then tools/, come above them all.
layers=(core sandbox shard gguf tokenizer model ref cpu gpu engine toploc rl mpi tools)
# Each public header's layer.
declare -A header_layer=(
  [vks_common]=core [vks_quant]=core [vks_philox]=core [vks_train_types]=core
  [vks_sandbox]=sandbox
  [vks_shard]=shard
  [vks_gguf]=gguf
  [vks_tokenizer]=tokenizer
  [vks_model]=model [vks_safetensors]=model [vks_checkpoint]=model
  [vks_lora]=model
  [vks_ref]=ref [vks_ref_forward]=ref [vks_ref_grad]=ref [vks_ref_train]=ref
  [vks_cpu]=cpu
  [vks_gpu]=gpu [vks_ops]=gpu [vks_ops_grad]=gpu
  [vks_engine]=engine [vks_sched]=engine [vks_train]=engine
  [vks_toploc]=toploc [vks_rollout]=toploc [vks_verify_group]=toploc
  [vks_rl]=rl [vks_rl_config]=rl [vks_rl_bans]=rl [vks_rl_roles]=rl [vks_grpo]=rl [vks_metrics]=rl [vks_prompt]=rl
  [vks_sft]=rl [vks_sft_data]=rl [vks_tasks]=rl [vks_difficulty_pool]=rl
  [vks_mpi]=mpi [vks_broadcast]=mpi [vks_link]=mpi [vks_partition]=mpi [vks_pipeline]=mpi
  [vks_rl_mpi]=mpi [vks_verifier]=mpi
)
declare -A rank=()
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done

bad=0
fail() { echo "$1" >&2; bad=1; }

for h in "$root"/include/vkswarm/*.h; do
  name=$(basename "$h" .h)
  [ -n "${header_layer[$name]:-}" ] || fail "include/vkswarm/$name.h: no layer (add it to tests/check_layers.sh)"
done

# check_public FILE LAYER HEADER: FILE (of LAYER) may include public HEADER.
check_public() {
  local hl=${header_layer[$(basename "$3" .h)]:-}
  if [ -z "$hl" ]; then
    fail "${1#"$root"/}: includes $3, not a public header"
  elif [ "${rank[$hl]}" -gt "${rank[$2]}" ]; then
    fail "${1#"$root"/} ($2) includes $3 of a higher layer ($hl)"
  fi
}
includes() { sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$1"; }

# A public header includes public headers (same folder) only.
check_header() {
  local inc
  while IFS= read -r inc; do
    if [[ $inc != */* && -f $root/include/vkswarm/$inc ]]; then check_public "$1" "$2" "$inc"
    else fail "${1#"$root"/}: includes \"$inc\", not a public header"; fi
  done < <(includes "$1")
}

# A file of folder DIR (LAYER) includes public headers (vkswarm/NAME.h) and
# its own folder's ("NAME.h" or "FOLDER/NAME.h") only.
check_source() {
  local inc dir=$3
  while IFS= read -r inc; do
    if [[ $inc == vkswarm/* && $inc != */*/* ]]; then check_public "$1" "$2" "${inc#vkswarm/}"
    elif [[ $inc != */* && -f $dir/$inc ]]; then :
    elif [[ $inc == "$(basename "$dir")"/* && $inc != */*/* && -f $dir/${inc#*/} ]]; then :
    else fail "${1#"$root"/}: includes \"$inc\", another folder's private header"; fi
  done < <(includes "$1")
}

for h in "$root"/include/vkswarm/*.h; do
  name=$(basename "$h" .h)
  [ -z "${header_layer[$name]:-}" ] || check_header "$h" "${header_layer[$name]}"
done
for dir in "$root"/src/*/ "$root"/mpi/ "$root"/tools/; do
  dir=${dir%/}
  layer=$(basename "$dir")
  if [ -z "${rank[$layer]:-}" ]; then fail "src/$layer: no layer (add it to tests/check_layers.sh)"; continue; fi
  for f in "$dir"/*.c "$dir"/*.h; do
    [ ! -f "$f" ] || check_source "$f" "$layer" "$dir"
  done
done
for f in "$root"/src/*.c "$root"/src/*.h; do
  [ ! -f "$f" ] || fail "${f#"$root"/}: outside every layer (src/FOLDER/)"
done

# Calls: every undefined symbol of an object of src/F that an object of src/G
# defines, with G above F. Objects are named src_F_FILE.c.o by meson; the
# generated SPIR-V table is the GPU's.
calls=$( { nm -A --defined-only "$libvks" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBRGSV]$/ {print "D", $1, $3}'
           nm -A --undefined-only "$libvks" 2>/dev/null | awk 'NF == 3 {print "U", $1, $3}'; } |
  awk -v order="${layers[*]}" '
    function layer(o,   n, p, l) {
      n = split(o, p, "[/:]"); o = p[n - 1]
      if (o ~ /^src_/) { l = substr(o, 5); sub(/_.*/, "", l); return l }
      return o ~ /shaders/ ? "gpu" : "?" o
    }
    function object(o,   n, p) { n = split(o, p, "[/:]"); return p[n - 1] }
    BEGIN { n = split(order, L, " "); for (i = 1; i <= n; i++) rank[L[i]] = i }
    $1 == "D" { def[$3] = $2; next }
    $3 in def {
      from = layer($2); to = layer(def[$3])
      if (!(from in rank)) unknown[object($2)] = 1
      else if (!(to in rank)) unknown[object(def[$3])] = 1
      else if (rank[to] > rank[from]) print object($2) " (" from ") calls " $3 " of " object(def[$3]) " (" to "), a higher layer"
    }
    END { for (o in unknown) print o ": no layer (add it to tests/check_layers.sh)" }' | sort -u)
[ -z "$calls" ] || fail "$calls"
mpi_syms=$(nm -g --defined-only "$libmpi" | awk 'NF == 3 {print $3}' | sort -u)
up=$(nm -u "$libvks" | awk '{print $NF}' | sort -u | comm -12 - <(echo "$mpi_syms") || true)
[ -z "$up" ] || fail "$(basename "$libvks") calls mpi/: $(echo $up)"

[ $bad -eq 0 ] && echo "layers: ${layers[*]} (each uses only those before it)"
exit $bad
