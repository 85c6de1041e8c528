# Sourced by the scripts that build on the GPU machine (scripts/gpu-check.sh,
# bench/): points pkg-config and the loader at the .devroot sysroot of Debian
# packages (../shared/gpu/devroot.sh) when it is there, and sets TORCH_PREFIX
# to the pip torch's CMake prefix (empty without a pip torch).
R=$PWD/.devroot
if [ -d "$R" ]; then
  export PKG_CONFIG_PATH=$R/usr/lib/x86_64-linux-gnu/pkgconfig:$R/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$R
  export LD_LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
