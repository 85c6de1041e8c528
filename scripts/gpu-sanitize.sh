#!/usr/bin/env bash
# Runs the fused kernels' CUDA tests (tests/engine/fused_ops_test, already
# built) under compute-sanitizer on the GPU machine:
#   memcheck   out-of-bounds and misaligned accesses, errors of CUDA calls;
#   racecheck  shared-memory hazards (the RMSNorm block reductions, the
#              partial-row sum of dweight, RoPE's shared cos/sin table), in
#              trainerd's kernels only: the tests' references report hazards
#              of their own (PyTorch's float64 reductions, 12 in
#              at::native::reduce_kernel on an H200 with LibTorch 2.11;
#              cuBLAS's nvjet GEMMs) that are not this project's to fix: the
#              verdict counts the reports that name a trainerd:: kernel. Only
#              trainerd's kernels are instrumented (--kernel-name
#              kns=trainerd; unfiltered, the fused suite takes over 150 s),
#              except in SUITE=gemm: with that filter the tool fails ("Internal
#              Sanitizer Error ... a hardware exception") on the Hopper GEMM's
#              tests and harness, which run clean unfiltered (H100, CUDA 13.0);
#   synccheck  barriers reached by part of a block.
# PyTorch's caching allocator is turned off so that every tensor is its own
# allocation and memcheck sees an access past its end; the tests run their
# smaller shapes (TRAINERD_FUSED_TEST_QUICK) since the tools slow kernels down
# by 10-100x. Usage: scripts/gpu-sanitize.sh [build dir, default /tmp/b].
# FILTER: a gtest filter over the CUDA tests (default every FusedOpsCudaTest),
# e.g. FILTER='FusedOpsCudaTest.*RmsNorm*' after a change to one kernel.
# SUITE=dropout: the LoRA dropout kernel's tests instead (tests/engine/lora_dropout_test
# on CUDA, default filter LoraDropout.*), once per dtype of DTYPES (default
# "bfloat16 float32": the kernels' instantiations differ by dtype; the float16
# test runs in both). SUITE=gemm: the Hopper GEMM's (tests/engine/epilogue_gemm_test in
# bfloat16, default filter SwiGluGemm.* and RopeGemm.* less the whole models'
# tests, whose cuDNN and cuBLAS kernels are not ours; its racecheck covers the
# epilogue's hand-over buffers). SUITE=attention: the Hopper attention's
# (tests/engine/hopper_attention_test in bfloat16, default filter
# HopperAttention.* less the model's test).
# TOOLS: the tools to run (default "memcheck racecheck synccheck").
# Logs go to $OUT (or /tmp/gpu-sanitize); prints one summary line and exits
# non-zero when a tool reported an error or the binary is missing.
set -uo pipefail
b=${1:-/tmp/b}
if [ "${SUITE:-fused}" = dropout ]; then
  bin=$b/tests/engine/lora_dropout_test filter=${FILTER:-LoraDropout.*}
  export TRAINERD_TEST_DEVICE=cuda
  dtypes=${DTYPES:-bfloat16 float32}
elif [ "${SUITE:-fused}" = attention ]; then
  bin=$b/tests/engine/hopper_attention_test filter=${FILTER:-HopperAttention.*-*.ModelTrains*}
  export TRAINERD_TEST_DEVICE=cuda
  dtypes=${DTYPES:-bfloat16}
elif [ "${SUITE:-fused}" = gemm ]; then
  bin=$b/tests/engine/epilogue_gemm_test filter=${FILTER:-SwiGluGemm.*:RopeGemm.*-*.ModelTrains*}
  instrument_all=1  # racecheck: the header says why
  export TRAINERD_TEST_DEVICE=cuda
  dtypes=${DTYPES:-bfloat16}
else
  bin=$b/tests/engine/fused_ops_test filter=${FILTER:-FusedOpsCudaTest.*}
  dtypes=own  # the fused tests run their own dtypes
fi
out=${OUT:-/tmp/gpu-sanitize}
mkdir -p "$out"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$bin" ]; then echo "gpu-sanitize: $bin is missing (build it first)"; exit 2; fi
if [ ! -x "$cs" ]; then echo "gpu-sanitize: compute-sanitizer not found (PATH or /usr/local/cuda/bin)"; exit 2; fi

export PYTORCH_NO_CUDA_MEMORY_CACHING=1 TRAINERD_FUSED_TEST_QUICK=1
summary="" failed=0
for dtype in $dtypes; do
  tag=
  if [ "$dtype" != own ]; then export TRAINERD_TEST_DTYPE=$dtype; tag=" $dtype"; fi
  for tool in ${TOOLS:-memcheck racecheck synccheck}; do
    log=$out/$tool${tag:+-$dtype}.log
    if [ "$tool" = racecheck ]; then
      only=(--kernel-name kns=trainerd)
      [ "${instrument_all:-0}" = 1 ] && only=()
      "$cs" --tool racecheck "${only[@]}" --print-limit 1000000 "$bin" --gtest_filter="$filter" > "$log" 2>&1
      rc=$?
      # Hazards in trainerd's kernels: the reports ("Error: Race reported between ... access at KERNEL+0x..")
      # whose accesses name one; the tool's summary counts the references' kernels too.
      ours=$(grep -E 'Race reported|access at|Thread \([0-9,]*\) at' "$log" | grep -c 'trainerd::')
      if [ "$rc" -eq 0 ] && [ "$ours" -gt 0 ]; then rc=1; fi
      verdict="$ours report lines in trainerd kernels; the tool's $(grep -E 'RACECHECK SUMMARY' "$log" | tail -1 |
        sed 's/^=* *//')"
    else
      "$cs" --tool "$tool" --error-exitcode 1 "$bin" --gtest_filter="$filter" > "$log" 2>&1
      rc=$?
      # The tool's own verdict ("ERROR SUMMARY: n errors").
      verdict=$(grep -E 'ERROR SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
    fi
    # gtest's totals: "[  PASSED  ] 4 tests." -> "4 passed".
    tests=$(grep -oE '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$log" |
      sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+).*/\2 \1/' | tr 'A-Z' 'a-z' | paste -sd, - | sed 's/,/, /g')
    # A run in which no CUDA test passed (skipped: no kernels built) proves nothing.
    if [ $rc -ne 0 ] || ! grep -qE '^\[ +PASSED +\] [1-9]' "$log"; then failed=1; fi
    summary+="$tool$tag rc=$rc (${verdict:-no summary}; tests: ${tests:-none ran}), "
  done
done
echo "gpu-sanitize: ${summary%, } -- logs in $out"
exit $failed
