#!/usr/bin/env bash
# Run on the GPU machine (see ../shared/gpu/README.md): builds against the LibTorch of the
# machine's PyTorch with CUDA, runs the whole suite on the CPU, the parity and packing suites on
# CUDA in float32 and bfloat16, checks that PEFT loads an adapter trainerd wrote, runs the demo
# on the GPU, and runs it again through trainerd (GPUs found by the worker) and trainctl; the fused
# kernels' and speed paths' tests on CUDA, and the kernels under compute-sanitizer.
# Logs go to $OUT (or /tmp/gpu-check).
# QUICK=1: only the engine's CUDA suites (parity, packing, fused kernels, speed paths, step graphs, LoRA
# dropout, the Hopper GEMM's epilogues, the Hopper attention; about two minutes with the build): the targets they need are built, and the CPU suite, compute-sanitizer,
# the PEFT and transformers loads, the demo and the daemon are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
. scripts/gpu-env.sh
b=/tmp/b
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch,transformers,peft;print("torch",torch.__version__,"transformers",transformers.__version__,"peft",peft.__version__)'
} 2>&1 | tee "$out/versions.txt"
quick=${QUICK:-0}
# Each CUDA suite under a time limit (TEST_TIMEOUT_S, default 300 s): a kernel that hangs is killed and
# reported (rc 124) instead of holding the device call to its end.
limited() { timeout --kill-after=10 "${TEST_TIMEOUT_S:-300}" "$@"; }
targets=()
[ "$quick" = 1 ] && targets=(--target parity_test packing_test fused_ops_test speed_paths_test step_graph_test
  lora_dropout_test epilogue_gemm_test hopper_attention_test)
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$R/usr" \
  > "$out/build.log" 2>&1 && cmake --build $b -j16 "${targets[@]}" -- -k 0 >> "$out/build.log" 2>&1
rc=$?; echo "build rc $rc"; grep -E 'error|FAILED' "$out/build.log" | head -20; tail -3 "$out/build.log"
if [ "$quick" != 1 ]; then
  echo "== ctest (CPU)"; ctest --test-dir $b -j8 --output-on-failure > "$out/ctest.log" 2>&1; echo "ctest rc $?"
  tail -5 "$out/ctest.log"
fi
for dtype in float32 bfloat16; do
  echo "== parity on cuda, $dtype"
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype TRAINERD_PEFT_CHECK_DIR=/tmp/peft-$dtype \
    limited $b/tests/engine/parity_test 2>&1 | tee "$out/parity-cuda-$dtype.log" | grep -E 'figure|FAILED|PASSED'
  echo "== packing on cuda, $dtype (bfloat16: variable-length flash attention)"
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype \
    limited $b/tests/engine/packing_test 2>&1 | tee "$out/packing-cuda-$dtype.log" | grep -E 'figure|FAILED|PASSED'
done
echo "== the fused kernels and the speed paths on cuda (bfloat16 and float32), then under compute-sanitizer"
TRAINERD_TEST_DEVICE=cuda limited $b/tests/engine/fused_ops_test > "$out/fused-ops-cuda.log" 2>&1
echo "fused_ops_test rc $?"
for dtype in bfloat16 float32; do
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype limited $b/tests/engine/speed_paths_test \
    > "$out/speed-paths-cuda-$dtype.log" 2>&1
  echo "speed_paths_test $dtype rc $?"
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype limited $b/tests/engine/step_graph_test \
    > "$out/step-graph-cuda-$dtype.log" 2>&1
  echo "step_graph_test $dtype rc $?"
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype limited $b/tests/engine/lora_dropout_test \
    > "$out/lora-dropout-cuda-$dtype.log" 2>&1
  echo "lora_dropout_test $dtype rc $?"
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype limited $b/tests/engine/epilogue_gemm_test \
    > "$out/epilogue-gemm-cuda-$dtype.log" 2>&1
  echo "epilogue_gemm_test $dtype rc $?"
  TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=$dtype limited $b/tests/engine/hopper_attention_test \
    > "$out/hopper-attention-cuda-$dtype.log" 2>&1
  echo "hopper_attention_test $dtype rc $?"
done
if [ "$quick" = 1 ]; then
  for log in "$out"/fused-ops-cuda.log "$out"/speed-paths-cuda-*.log "$out"/step-graph-cuda-*.log \
    "$out"/lora-dropout-cuda-*.log "$out"/epilogue-gemm-cuda-*.log "$out"/hopper-attention-cuda-*.log; do grep -E '^\[  (PASSED|FAILED)' "$log"; done
  exit 0
fi
OUT=$out/sanitize bash scripts/gpu-sanitize.sh $b
OUT=$out/sanitize-dropout SUITE=dropout bash scripts/gpu-sanitize.sh $b
OUT=$out/sanitize-gemm SUITE=gemm bash scripts/gpu-sanitize.sh $b
OUT=$out/sanitize-attention SUITE=attention bash scripts/gpu-sanitize.sh $b
echo "== PEFT loads the adapter trainerd wrote (trained on CUDA float32, checked on CPU)"
python3 tools/check_peft_load.py tests/fixtures/llama/model /tmp/peft-float32 2>&1 | tail -1 | tee "$out/peft-load.txt"
echo "== demo on the GPU"; $b/bin/trainerd-worker run etc/examples/tiny-lora.yaml > "$out/demo.log" 2>&1; echo "demo rc $?"; tail -3 "$out/demo.log"
echo "== transformers loads a merged model trainerd wrote"
$b/bin/trainerd-worker run etc/examples/merge-check.yaml > "$out/merge.log" 2>&1 &&
  python3 tools/check_merged_load.py tests/fixtures/llama/model /tmp/trainerd-merge-check 2>&1 | tail -1 | tee "$out/merged-load.txt"
echo "== trainerd on the GPU: the devices the worker reports, the demo job through trainerd + trainctl"
$b/bin/trainerd-worker devices 2>&1 | tee "$out/devices.txt"
d=/tmp/gpu-check-daemon; rm -rf $d; mkdir -p $d
$b/bin/trainerd --socket $d/sock --state-dir $d/state 2> "$out/trainerd.log" &
daemon=$!
for _ in $(seq 100); do [ -S $d/sock ] && break; sleep 0.1; done
TRAINERD_SOCKET=$d/sock $b/bin/trainctl submit etc/examples/tiny-lora.yaml --wait > "$out/daemon-demo.txt" 2>&1
echo "trainctl submit --wait rc $?"
TRAINERD_SOCKET=$d/sock $b/bin/trainctl status 1 | tee -a "$out/daemon-demo.txt"
TRAINERD_SOCKET=$d/sock $b/bin/trainctl logs 1 > "$out/daemon-demo-log.txt"
kill -TERM $daemon; wait $daemon; echo "trainerd exit $?"
