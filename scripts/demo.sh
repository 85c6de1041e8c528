#!/usr/bin/env bash
# The demo: installs the Debian packages, builds trainerd, trainerd-worker and trainctl, starts the
# trainerd daemon for this user, submits the example job (a LoRA fine-tune of the bundled tiny
# Llama, on the GPU when there is one, else the CPU) with trainctl, follows its log to the end and
# stops the daemon.
#   scripts/demo.sh            (as root, or a user with sudo)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || scripts/deps.sh
scripts/build.sh --target trainerd --target trainerd-worker --target trainctl
bin=${BUILD_DIR:-build}/bin

# The daemon's socket and queue live in a folder of their own, so the demo leaves the machine's
# (or the user's) trainerd alone; a real install uses systemd (docs/daemon-config.md).
demo=/tmp/trainerd-demo-daemon
rm -rf "$demo"
mkdir -p "$demo"
export TRAINERD_SOCKET=$demo/trainerd.sock
"$bin/trainerd" --socket "$TRAINERD_SOCKET" --state-dir "$demo/state" 2> "$demo/trainerd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  [ -S "$TRAINERD_SOCKET" ] && break
  kill -0 $daemon 2>/dev/null || { cat "$demo/trainerd.log"; exit 1; }
  sleep 0.1
done
echo "trainerd is running (pid $daemon, log in $demo/trainerd.log); submitting the example job:"
# --follow prints the job's log as it is written and exits with the job's result.
"$bin/trainctl" submit etc/examples/tiny-lora.yaml --follow
echo
"$bin/trainctl" status 1
echo
echo "The adapter (PEFT format) is in /tmp/trainerd-demo/adapter; per-step figures in /tmp/trainerd-demo/metrics.jsonl."
