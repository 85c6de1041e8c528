#!/usr/bin/env bash
# Installs every Debian 12 package that building, running and testing trainerd needs.
# This file is the only list of them. Safe to run again.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev            # LibTorch 1.13 (CPU): the engine
  libopenblas0-pthread    # fast BLAS for LibTorch on the CPU (else the reference BLAS, ~20x slower)
  libyaml-cpp-dev         # job specs and config
  nlohmann-json3-dev      # safetensors headers, config.json, metrics
  libgtest-dev libgmock-dev
  libspdlog-dev libfmt-dev
  libprotobuf-dev protobuf-compiler
  libboost-dev libboost-system-dev
  libsqlite3-dev
  libsystemd-dev
  systemd                 # systemd-analyze, -sysusers, -tmpfiles: the unit tests
  libpcre2-dev
  libcli11-dev
  python3
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}"
