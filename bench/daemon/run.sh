#!/usr/bin/env bash
# trainerd's start-up time and the latency of status and list with 10,000 jobs in the store and a job
# running (see bench/README.md). From the repository root:
#
#   bash bench/daemon/run.sh [daemon_bench options, e.g. --jobs 2000 --starts 3; --help lists them]
#
# Builds daemon_bench, trainerd, trainerd-worker and trainctl in $BUILD_DIR (default build/,
# configured first if it has no CMakeCache.txt), prints the machine, then runs the benchmark in a
# temporary folder. Writes daemon-bench.md (the machine and the tables), results.json and bench.log
# to $OUT (default /tmp/bench-daemon). $JOBS: parallel build jobs (default: nproc); NO_BUILD=1
# measures the programs already in $BUILD_DIR without building.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/bench-daemon}
b=${BUILD_DIR:-build}
mkdir -p "$out"

if [ "${NO_BUILD:-0}" != 1 ]; then
  : > "$out/build.log"
  if [ ! -f "$b/CMakeCache.txt" ]; then
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    echo "configuring $b (log: $out/build.log)"
    cmake -S . -B "$b" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >> "$out/build.log" 2>&1 ||
      { tail -20 "$out/build.log"; echo "configure failed"; exit 1; }
  fi
  echo "building daemon_bench trainerd trainerd-worker trainctl in $b (log: $out/build.log)"
  start=$SECONDS
  if ! cmake --build "$b" -j"${JOBS:-$(nproc)}" --target daemon_bench trainerd trainerd-worker trainctl \
       >> "$out/build.log" 2>&1; then
    grep -E 'error|FAILED' "$out/build.log" | head -20
    tail -5 "$out/build.log"
    echo "build failed"
    exit 1
  fi
  echo "built in $((SECONDS - start)) s"
fi

os=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}" || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# daemon_bench, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "- machine: $(nproc) cores, ${cpu:-unknown CPU}, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) memory"
  echo "- system: $os, kernel $(uname -r) ($(uname -m))"
  echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- source: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' + local changes'); build type $(grep -m1 '^CMAKE_BUILD_TYPE' "$b/CMakeCache.txt" | cut -d= -f2)"
} | tee "$out/daemon-bench.md"

# The tables (stdout) go to daemon-bench.md, progress and errors (stderr) to bench.log; both to the terminal.
set +e
"$b/bench/daemon/daemon_bench" --trainerd "$b/bin/trainerd" --trainctl "$b/bin/trainctl" \
  --worker "$b/bin/trainerd-worker" --json "$out/results.json" "$@" \
  2> >(tee "$out/bench.log" >&2) | tee -a "$out/daemon-bench.md"
status=${PIPESTATUS[0]}
set -e
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/daemon-bench.md"
echo "written: $out/daemon-bench.md, $out/results.json, $out/bench.log"
exit "$status"
