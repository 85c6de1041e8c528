#!/usr/bin/env bash
# Builds variants of the Hopper GEMM's harness (engine/kernels/hopper_gemm.cu's
# compile-time knobs), then checks each and measures its joules a launch on
# some cases, one variant after another on the same card. On the GPU machine,
# from the repository root (bench/README.md):
#
#   bash bench/gemm/variants.sh
#   VARIANTS="units4: tma:-DHG_BACKWARD_TMA=1" CASES="dh of down" bash bench/gemm/variants.sh
#
# Environment (all optional):
#   VARIANTS   space-separated NAME:FLAGS, FLAGS comma-separated -D options (empty: the defaults); default:
#              SwiGLU's backward epilogue five ways: as first measured (2 units a thread in flight, accurate
#              sigmoid), then with the fast sigmoid: 4 units, by TMA, each with and without L2 prefetch
#   CASES      ;-separated case names (or parts of names) for the energy mode; default: SwiGLU's backward
#   CHECK_TIMEOUT_S=120 ENERGY_TIMEOUT_S=90   a hung variant is killed, the others still run
#   OUT        logs go there (default /tmp/gemm-variants); the verdict lines are printed
#   BIN_DIR    the variants' binaries (default /tmp/gemm-variants-bin: not among the logs)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/build_variants.sh
variants=${VARIANTS:-"units2-accurate:-DHG_BACKWARD_UNITS=2,-DHG_FAST_SILU=0 units4: \
units4-prefetch:-DHG_BACKWARD_PREFETCH=1 tma:-DHG_BACKWARD_TMA=1 tma-prefetch:-DHG_BACKWARD_TMA=1,-DHG_BACKWARD_PREFETCH=1"}
cases=${CASES:-"dh of down with SwiGLU backward (W^T)"}
out=${OUT:-/tmp/gemm-variants}
bin=${BIN_DIR:-/tmp/gemm-variants-bin}
mkdir -p "$out" "$bin"
nvcc_flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I.)
sources=(bench/gemm/hopper_gemm.cu engine/kernels/hopper_gemm.cu -lcublas -ldl)

build_variants "$variants"

IFS=';' read -r -a case_list <<< "$cases"
for v in $variants; do
  name=${v%%:*}
  [ -x "$bin/$name" ] || continue
  echo "== $name (${v#*:})"
  timeout "${CHECK_TIMEOUT_S:-120}" "$bin/$name" check > "$out/$name.check.log" 2>&1
  rc=$?
  failed=$(grep -c FAILED "$out/$name.check.log")
  echo "check rc $rc: $(tail -1 "$out/$name.check.log")"
  [ "$rc" = 0 ] && [ "$failed" = 0 ] || { grep FAILED "$out/$name.check.log" | head -5; continue; }
  for c in "${case_list[@]}"; do
    log="$out/$name.energy-$(printf %s "$c" | tr -c 'a-zA-Z0-9' _).log"
    timeout "${ENERGY_TIMEOUT_S:-90}" "$bin/$name" energy "$c" > "$log" 2>&1
    echo "energy \"$c\" rc $?"
    grep "later rounds" "$log"
  done
done
