#!/usr/bin/env bash
# Configures and builds trainerd into build/ (or $BUILD_DIR). Extra arguments go to the build step
# (e.g. --target trainerd-worker). Uses ccache when present.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
fi
cmake --build "$build" -j "$jobs" "$@"
