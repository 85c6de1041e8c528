#!/usr/bin/env bash
# Builds variants of the Hopper attention's harness (engine/kernels/hopper_attention.cu's
# compile-time knobs), checks each, times it and measures its joules a launch at the 8b
# shape, one variant after another on the same card; then cuDNN's joules on the same start
# (attention_energy.py), which the step runs otherwise. On the GPU machine, from the
# repository root (bench/README.md):
#
#   bash bench/attention/variants.sh
#   VARIANTS="default: backward-stages3:-DHA_BACKWARD_STAGES=3" CUDNN=0 bash bench/attention/variants.sh
#
# Environment (all optional):
#   VARIANTS   space-separated NAME:FLAGS, FLAGS comma-separated -D options (empty: the defaults); default:
#              the defaults, a third K/V stage in the forward's ring, a third Q/dO stage in the backward's
#   ENERGY_SECONDS=2 ENERGY_ROUNDS=2   each variant's energy mode (the harness's defaults are 3 and 3)
#   CUDNN      1 (default): also python3 bench/attention/attention_energy.py (cuDNN and flash, 3 rounds of 2 s)
#   CHECK_TIMEOUT_S=60 ENERGY_TIMEOUT_S=90   a hung variant is killed, the others still run
#   OUT        logs go there (default /tmp/attention-variants); the summary lines are printed
#   BIN_DIR    the variants' binaries (default /tmp/attention-variants-bin: not among the logs)
# Summary: per variant, the later rounds' means (the first starts from a cooler card) of the forward, the
# backward and both: ms and joules a call, and joules a PFLOP (attention_energy.py's for cuDNN alike).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/build_variants.sh
variants=${VARIANTS:-"default: stages3:-DHA_STAGES=3 backward-stages3:-DHA_BACKWARD_STAGES=3"}
out=${OUT:-/tmp/attention-variants}
bin=${BIN_DIR:-/tmp/attention-variants-bin}
mkdir -p "$out" "$bin"
nvcc_flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I. -Xptxas -v)
sources=(bench/attention/hopper_attention.cu engine/kernels/hopper_attention.cu -ldl)

# The later rounds' mean of each case in an energy log (lines "round R  NAME ... MS ms J J ... X J/PFLOP").
later_rounds() {
  awk '$1 == "round" && $2 > 0 {
         name = ""; for (f = 3; f <= NF && $f !~ /^[0-9.]+$/; ++f) name = name (name == "" ? "" : " ") $f
         for (g = f; g <= NF; ++g) {
           if ($g == "ms") ms = $(g - 1)
           if ($g == "J") j = $(g - 1)
           if ($g == "J/PFLOP") jp = $(g - 1)
         }
         if (!(name in n)) order[++count] = name
         n[name]++; sms[name] += ms; sj[name] += j; sjp[name] += jp
       }
       END { for (c = 1; c <= count; ++c) { k = order[c]
               printf "  %-26s %8.3f ms %8.4f J %6.3f J/PFLOP (rounds 1..%d)\n",
                      k, sms[k] / n[k], sj[k] / n[k], sjp[k] / n[k], n[k] } }' "$1"
}

build_variants "$variants"

for v in $variants; do
  name=${v%%:*}
  [ -x "$bin/$name" ] || continue
  echo "== $name (${v#*:})"
  # ptxas's word on serialised wgmma (C7512-C7514: the products wait for each other) and on spills.
  grep -o "(C75[0-9]*) Potential Performance Loss: wgmma[^']*" "$out/$name.build.log" | sort -u | sed 's/^/  ptxas: /'
  awk '/Compiling entry function/ {
         kernel = ($0 ~ /ForwardKernel/) ? "forward" : ($0 ~ /BackwardKernel/) ? "backward" : ""
       }
       /spill stores/ && kernel != "" { printf "  ptxas: the %s kernel spills %s bytes\n", kernel, $5; kernel = "" }' \
    "$out/$name.build.log"
  timeout "${CHECK_TIMEOUT_S:-60}" "$bin/$name" check > "$out/$name.check.log" 2>&1
  rc=$?
  echo "check rc $rc: $(tail -1 "$out/$name.check.log")"
  [ "$rc" = 0 ] || { grep -iE "fail|error" "$out/$name.check.log" | head -5; continue; }
  timeout 30 "$bin/$name" time "8b:" 2>&1 | tee "$out/$name.time.log" | sed 's/^/  /'
  ENERGY_SECONDS=${ENERGY_SECONDS:-2} ENERGY_ROUNDS=${ENERGY_ROUNDS:-2} timeout "${ENERGY_TIMEOUT_S:-90}" \
    "$bin/$name" energy > "$out/$name.energy.log" 2>&1
  echo "energy rc $?"
  later_rounds "$out/$name.energy.log"
done

if [ "${CUDNN:-1}" = 1 ]; then
  echo "== cuDNN and flash (attention_energy.py)"
  timeout "${ENERGY_TIMEOUT_S:-90}" python3 bench/attention/attention_energy.py --rounds 3 --seconds 2 \
    > "$out/cudnn.energy.log" 2>&1
  echo "rc $?"
  later_rounds "$out/cudnn.energy.log"
fi
