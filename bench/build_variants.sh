# Sourced by bench/gemm/variants.sh and bench/attention/variants.sh: build_variants VARIANTS builds each
# space-separated NAME:FLAGS of VARIANTS (FLAGS comma-separated -D options, empty for the defaults) at once,
# as nvcc "${nvcc_flags[@]}" FLAGS -o "$bin/NAME" "${sources[@]}", its output in "$out/NAME.build.log";
# a variant that does not build is said so and left out (no binary).
build_variants() {
  echo "== building: $1"
  local v name defines
  for v in $1; do
    name=${v%%:*}
    IFS=, read -r -a defines <<< "${v#*:}"
    (nvcc "${nvcc_flags[@]}" "${defines[@]}" -o "$bin/$name" "${sources[@]}" > "$out/$name.build.log" 2>&1 ||
      echo "error: $name did not build (see $out/$name.build.log)") &
  done
  wait
}
