#!/usr/bin/env bash
# Tokens per second of `trainerd-worker tokenize` against Hugging Face tokenizers (see
# bench/README.md). From the repository root:
#
#   bash bench/tokenizer/run.sh [TRAINERD_WORKER] [tokenizer_bench.py options, e.g. --corpus-mb 2]
#
# Without a binary it builds trainerd-worker (Release) into $BUILD_DIR (default /tmp/b, the build
# folder scripts/gpu-check.sh uses), against the LibTorch of the pip torch and the .devroot sysroot
# when they are there (the GPU machine). Writes tokenizer-bench.md, results.json and bench.log to
# $OUT (default /tmp/bench-tokenizer); the corpus and the tokenizers go to /tmp/bench-tokenizer-work.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/bench-tokenizer}
mkdir -p "$out"
. scripts/gpu-env.sh

worker=
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  worker=$1
  shift
fi
if [ -z "$worker" ]; then
  b=${BUILD_DIR:-/tmp/b}
  prefix=()
  if [ -n "$TORCH_PREFIX" ]; then
    prefix=(-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$R/usr")  # as scripts/gpu-check.sh
  fi
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  echo "building trainerd-worker in $b (log: $out/build.log)"
  start=$SECONDS
  if ! { cmake -S . -B "$b" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" &&
         cmake --build "$b" -j"$(nproc)" --target trainerd-worker; } > "$out/build.log" 2>&1; then
    grep -E 'error|FAILED' "$out/build.log" | head -20
    tail -5 "$out/build.log"
    echo "build failed"
    exit 1
  fi
  echo "built in $((SECONDS - start)) s"
  worker=$b/bin/trainerd-worker
fi

python3 bench/tokenizer/tokenizer_bench.py --worker "$worker" --out "$out" "$@" 2>&1 | tee "$out/bench.log"
exit "${PIPESTATUS[0]}"
