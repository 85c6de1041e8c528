#!/usr/bin/env bash
# The test command: installs the Debian packages, builds everything and runs every test.
#   scripts/test.sh            (as root, or a user with sudo)
# Set SKIP_DEPS=1 to skip the package step on a machine already set up.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || scripts/deps.sh
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}"
