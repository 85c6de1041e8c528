#!/usr/bin/env bash
# The demo: installs the Debian packages, builds trainerd-worker and runs the example job,
# a LoRA fine-tune of the bundled tiny Llama (on the GPU when there is one, else the CPU).
#   scripts/demo.sh            (as root, or a user with sudo)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || scripts/deps.sh
scripts/build.sh --target trainerd-worker
build=${BUILD_DIR:-build}
"$build/worker/trainerd-worker" run etc/examples/tiny-lora.yaml
echo
echo "The adapter (PEFT format) is in /tmp/trainerd-demo/adapter; per-step figures in /tmp/trainerd-demo/metrics.jsonl."
