#!/usr/bin/env bash
# Training speed: trainerd-worker against Hugging Face PEFT (plain and torch.compile) on identical
# random weights and token ids, one command on the GPU machine (see bench/speed/README.md). From
# the repository root, with .devroot carried (../shared/gpu/README.md):
#
#   bash bench/speed/run.sh
#   KEEP=1 bash bench/speed/run.sh      # continue a run cut short, on the same warm machine
#
# Environment (all optional):
#   ROWS="1b 8b 8b-ckpt"                 rows to run (below); "custom" is the row of the CUSTOM_* variables
#   CUSTOM_SHAPE=llama3-8b               the custom row's base shape (a key of hf_peft_baseline.py's SHAPES)
#   CUSTOM_CONFIG='{"num_attention_heads": 16}'  config.json keys over the base shape (JSON; default none)
#   CUSTOM_MB=4 CUSTOM_SEQ=2048 CUSTOM_CKPT=0    its micro-batch, sequence length, activation checkpointing
#   CKPT_LAYERS=14                       the 8b-ckpt row: how many layers trainerd recomputes
#   LORA_R=16 LORA_ALPHA=2*LORA_R        the LoRA rank and alpha of every row, on both sides
#   LORA_DROPOUT=0.0                     LoRA dropout of every row, on both sides
#   SYSTEMS="trainerd hf hf-compile"     systems to run on each row
#   WORK_DIR=/tmp/trainerd-speed         model folders, token files, jobs, logs; results in $WORK_DIR/results
#   KEEP=1                               keep the good results already there, run only what is missing or failed
#                                        (without it every selected row and system runs again; the results of
#                                        the others stay in $WORK_DIR/results and in the table, unless the row
#                                        now runs with other settings: then all its old results go, see README.md)
#   BUILD_DIR=/tmp/b                     where trainerd-worker is built (skipped if built there from the same sources)
#   NO_BUILD=1                           use the trainerd-worker in $BUILD_DIR as it is, never build
#   WARMUP=3 STEPS=10                    untimed and timed steps, the same for every system
#   BUDGET_S=540                         start no measurement that would likely end after this many seconds
#   RUN_TIMEOUT_S=0                      kill one measurement after this many seconds (0: never)
#   TRAINERD_EXTRA_YAML='key: value'     extra training: keys for trainerd on every row (one per line)
#   TRAINERD_HOPPER_GEMM=0|1|2|3         trainerd's SwiGLU in the MLP's GEMMs (engine/epilogue_gemm.h; 1 forward, 2
#                                        backward too, 3 LoRA's products over its rows too; unset: 2 for bf16 on a
#                                        Hopper GPU)
#   TRAINERD_HOPPER_ROPE=0|1             trainerd's rotary embedding in q|k|v's GEMM (unset: on there)
#   TRAINERD_HOPPER_DOWN_LORA=0|1        down's LoRA product x A^T in gate|up's GEMM too (engine/epilogue_gemm.h;
#                                        SwiGLU level 2 or more; unset: off)
#   TRAINERD_HOPPER_ATTENTION=0|1        trainerd's attention on its Hopper kernels (engine/hopper_attention.h; unset:
#                                        on for bf16 on a Hopper GPU with heads of 128)
#   TRAINERD_COMMIT=abc123               the commit to report (default: git's HEAD; give it for a tree copied without .git)
#   PROFILE=1                            after each trainerd row, profile two more of its steps (trainerd-worker
#                                        --profile) and summarise where they went: profile-ROW.txt in the results
#   OUT                                  if set: speed.md (the table), results.json (every figure), run.log
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
here=bench/speed
work=${WORK_DIR:-/tmp/trainerd-speed}
results=$work/results
build=${BUILD_DIR:-/tmp/b}
rows=${ROWS:-1b 8b 8b-ckpt}
systems=${SYSTEMS:-trainerd hf hf-compile}
warmup=${WARMUP:-3}
steps=${STEPS:-10}
keep=${KEEP:-0}
budget=${BUDGET_S:-0}
run_timeout=${RUN_TIMEOUT_S:-0}
profile=${PROFILE:-0}
extra_all=${TRAINERD_EXTRA_YAML:-}
lora_r=${LORA_R:-16}
lora_alpha=${LORA_ALPHA:-}
lora_dropout=${LORA_DROPOUT:-0.0}
out=${OUT:-}
export PYTHONUNBUFFERED=1

mkdir -p "$work/models" "$work/runs" "$results" || { echo "error: cannot create $work"; exit 1; }
[ -n "$out" ] && mkdir -p "$out"

say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*"; }
fail() { echo "ERROR: $*"; }

# One row of the table: sets shape (a SHAPES key), shape_config (JSON over it, or empty), model_name
# (its folder under $work/models), mb (sequences per optimizer step), seq, ckpt (activation
# checkpointing), t_mb and t_accum (trainerd's micro-batch and accumulation steps, t_mb * t_accum =
# mb: the same batch, the same gradient) and TRAINERD_EXTRA_YAML (keys added under trainerd's
# training: section, one "key: value" a line).
row_def() {
  TRAINERD_EXTRA_YAML= shape_config= t_mb= t_accum=1
  case $1 in
    1b) shape=llama3-1b mb=8 seq=2048 ckpt=0 ;;
    8b) shape=llama3-8b mb=4 seq=2048 ckpt=0 ;;
    8b-ckpt) shape=llama3-8b mb=8 seq=2048 ckpt=1
      # Memory savers of trainerd's choosing: two micro-batches of 4 (the optimizer steps on the sum
      # of their gradients), and 14 of the 32 layers recomputed: the fastest split within the
      # compiled reference's 31.5 GiB on an H200 (30.3 GiB; 17 layers: 28.4 GiB; NOTES.md, "Runs").
      t_mb=4 t_accum=2
      TRAINERD_EXTRA_YAML=$'gradient_checkpointing: true\ngradient_checkpointing_layers: '${CKPT_LAYERS:-14} ;;
    custom) shape=${CUSTOM_SHAPE:-llama3-8b} mb=${CUSTOM_MB:-4} seq=${CUSTOM_SEQ:-2048} ckpt=${CUSTOM_CKPT:-0}
      shape_config=${CUSTOM_CONFIG:-}
      [ "$ckpt" = 1 ] && TRAINERD_EXTRA_YAML='gradient_checkpointing: true' ;;
    *) return 1 ;;
  esac
  [ -n "$t_mb" ] || t_mb=$mb
  model_name=$shape
  # A shape with overrides gets a folder of its own, named by them.
  [ -n "$shape_config" ] && model_name=$shape-$(printf '%s' "$shape_config" | md5sum | cut -c1-8)
  return 0
}

# Rough seconds each part takes on an H200 (for BUDGET_S): about 1.5x what the parts took on
# 2026-12-04 (writing llama3-8b 27-32 s, 1b's compiled reference 87 s, 8b's 155 s), so that a
# slower start still fits.
estimate() {
  case $1 in
    save:llama3-1b) echo 40 ;;
    save:llama3-8b) echo 50 ;;
    1b:trainerd | 1b:hf) echo 50 ;;
    1b:hf-compile) echo 130 ;;
    8b:trainerd | 8b:hf) echo 110 ;;
    8b:hf-compile) echo 230 ;;
    8b*:trainerd | 8b*:hf) echo 110 ;;
    8b*:hf-compile) echo 270 ;;
    *) echo 120 ;;
  esac
}

# True if a part estimated at $1 seconds still fits BUDGET_S.
fits() { [ "$budget" -le 0 ] || [ $((SECONDS + $1)) -le "$budget" ]; }

result_file() { echo "$results/$1.$2.json"; }
# The settings of row $r (after row_def) as speed_util.py's row arguments: what its systems share.
row_args() {
  echo --row "$r" --shape "$model_name" --micro-batch "$mb" --seq "$seq" --grad-ckpt "$ckpt" --lora-r "$lora_r" \
    --lora-alpha "$lora_alpha" --lora-dropout "$lora_dropout"
}
have_result() { python3 "$here/speed_util.py" ok "$(result_file "$1" "$2")"; }

report() {  # the bundle and the table, after every result: what is under $OUT is current if the command is cut
  python3 "$here/speed_util.py" bundle --results "$results" --out "${out:-$work}/results.json" ||
    fail "could not bundle the results"
  OUT=$out python3 "$here/report.py" "$results" > "$work/speed.md" 2> "$work/report.err" ||
    { fail "report.py failed:"; cat "$work/report.err"; }
}

for r in $rows; do row_def "$r" || { fail "unknown row '$r' (rows: 1b 8b 8b-ckpt custom)"; exit 2; }; done
case "$lora_r" in '' | *[!0-9]*) fail "LORA_R must be a whole number, got '$lora_r'"; exit 2 ;; esac
[ -n "$lora_alpha" ] || lora_alpha=$((2 * lora_r))
case "$lora_alpha" in *[!0-9]*) fail "LORA_ALPHA must be a whole number, got '$lora_alpha'"; exit 2 ;; esac
case "$lora_dropout" in
  0 | 0.* | .*) ;;
  *) fail "LORA_DROPOUT must be a number in [0, 1), got '$lora_dropout'"; exit 2 ;;
esac
for s in $systems; do
  case $s in trainerd | hf | hf-compile) ;; *) fail "unknown system '$s' (systems: trainerd hf hf-compile)"; exit 2 ;; esac
done

# The run itself (not indented: it holds a here-document); its output also goes to run.log (the end).
main() {
# What is left to do, so that a continued run builds and writes only what it needs.
todo=() need_trainerd=0 models=() model_rows=()  # model_rows: one row per model folder to write
for r in $rows; do
  row_def "$r"
  # A row's results of other settings (another custom shape, batch, rank or dropout), of any system, go:
  # the table compares only results of one computation.
  python3 "$here/speed_util.py" stale --results "$results" $(row_args) | while read -r line; do say "$line"; done
  for s in $systems; do
    if [ "$keep" = 1 ] && have_result "$r" "$s"; then
      say "kept: $r $s ($(result_file "$r" "$s"))"
      continue
    fi
    rm -f "$(result_file "$r" "$s")"
    todo+=("$r:$s")
    [ "$s" = trainerd ] && need_trainerd=1
    [[ " ${models[*]} " == *" $model_name "* ]] || { models+=("$model_name"); model_rows+=("$r"); }
  done
done
say "to run: ${todo[*]:-nothing}"

# --- versions -----------------------------------------------------------------------------------
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh
if [ -n "${TRAINERD_COMMIT:-}" ]; then
  commit=$TRAINERD_COMMIT  # the caller knows best: a tree copied with a stale .git reports its HEAD
elif commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  git diff --quiet HEAD 2>/dev/null || commit="$commit+local-changes"
else
  commit=unknown  # a tree copied without .git, and no TRAINERD_COMMIT
fi
python3 "$here/speed_util.py" versions --commit "$commit" --out "$results/versions.json" ||
  fail "could not record the versions"

if [ ${#todo[@]} -eq 0 ]; then
  say "every result is there; the table:"
  report
  cat "$work/speed.md"
  exit 0
fi

# --- build ----------------------------------------------------------------------------------------
# A build is skipped when the worker there was built by this script from the same sources (a stamp
# of their contents: the tree copied to the GPU machine gets new file times on every call).
worker=$build/bin/trainerd-worker
trainerd_ok=1
cmake_flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DTRAINERD_BUILD_TESTS=OFF
             -DTRAINERD_BUILD_BENCH=OFF "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX;$R/usr")
src_stamp() {
  { echo "${cmake_flags[*]}"
    find CMakeLists.txt common engine proto worker daemon ctl -type f -print0 | sort -z | xargs -0 md5sum
  } | md5sum | cut -d' ' -f1
}
stamp_file=$build/.bench-speed-stamp
if [ "$need_trainerd" = 1 ]; then
  if [ "${NO_BUILD:-0}" = 1 ]; then
    [ -x "$worker" ] || { fail "NO_BUILD=1 but $worker is not there: trainerd rows will fail"; trainerd_ok=0; }
  elif [ -x "$worker" ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$(src_stamp)" ]; then
    say "trainerd-worker in $build was built from these sources: no build"
  else
    say "building trainerd-worker (Release, sm_90) in $build (log: $work/build.log)"
    start=$SECONDS
    rm -f "$stamp_file"
    if { cmake -S . -B "$build" "${cmake_flags[@]}" &&
         cmake --build "$build" -j16 --target trainerd-worker; } > "$work/build.log" 2>&1; then
      say "built in $((SECONDS - start)) s"
      src_stamp > "$stamp_file"
    else
      grep -E 'error|FAILED' "$work/build.log" | head -20
      tail -5 "$work/build.log"
      fail "the build failed (log: $work/build.log): trainerd rows will fail; the references still run"
      trainerd_ok=0
    fi
  fi
fi

# --- the ceiling, once per run (kept with KEEP=1) ------------------------------------------------------
if [ "$keep" = 1 ] && [ -f "$results/ceiling.json" ]; then
  say "kept the matmul ceiling: $(tr -d '\n' < "$results/ceiling.json")"
else
  say "measuring the bf16 matmul ceiling and the copy bandwidth"
  python3 "$here/speed_util.py" ceiling --out "$results/ceiling.json" ||
    fail "the ceiling measurement failed: MFU will be missing"
fi

# --- model folders (random weights, HF format), written once per work dir --------------------------
model_ok() { [ -f "$work/models/$1/config.json" ]; }
ensure_model() {  # a row whose model folder to write: a SHAPES key, or one with overrides (custom)
  row_def "$1"
  local name=$model_name d=$work/models/$model_name start=$SECONDS s=$shape saver
  model_ok "$name" && return 0
  fits "$(estimate "save:$s")" || { say "skipped writing $name: BUDGET_S"; return 1; }
  local avail
  avail=$(df -Pk "$work" | awk 'NR == 2 {print int($4 / 1048576)}')
  say "writing random weights of $s${shape_config:+ with $shape_config} to $d (${avail:-?} GiB free)"
  rm -rf "$d.tmp"
  if [ -n "$shape_config" ]; then
    saver=(python3 "$here/speed_util.py" save-model --shape "$s" --config "$shape_config" --out "$d.tmp")
  else
    saver=(python3 "$here/hf_peft_baseline.py" --shape "$s" --save-model "$d.tmp")
  fi
  if "${saver[@]}" > "$work/save-$name.log" 2>&1 && mv "$d.tmp" "$d"; then
    say "wrote $s in $((SECONDS - start)) s ($(du -sh "$d" | cut -f1))"
  else
    tail -5 "$work/save-$name.log"
    fail "writing the $name folder failed (log: $work/save-$name.log); its rows are skipped"
    rm -rf "$d.tmp"
    return 1
  fi
}
for r in "${model_rows[@]}"; do ensure_model "$r"; done

# --- the measurements ---------------------------------------------------------------------------
run_timed() {  # log, command...: runs it under RUN_TIMEOUT_S, sets rc and wall; samples the GPU's power
  local log=$1 t0 sampler=
  shift
  # The card's power, SM clock and utilisation every 200 ms while the command runs ($log.power.csv):
  # at the 8b row the card runs at its power limit, and the clock it is left shows how much.
  rm -f "$log.power.csv"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=power.draw,clocks.sm,utilization.gpu --format=csv,noheader,nounits -lms 200 \
      > "$log.power.csv" 2> /dev/null &
    sampler=$!
  fi
  t0=$(date +%s.%N)
  if [ "$run_timeout" -gt 0 ]; then
    timeout --kill-after=20 "$run_timeout" "$@" > "$log" 2>&1
  else
    "$@" > "$log" 2>&1
  fi
  rc=$?
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  [ -n "$sampler" ] && { kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null; }
  return 0
}

write_job() {  # job yaml, model dir, tokens file, output dir
  local extra
  extra=$(printf '%s\n%s\n' "$TRAINERD_EXTRA_YAML" "$extra_all" | sed '/^[[:space:]]*$/d; s/^/  /')
  cat > "$1" <<EOF
# bench/speed/run.sh, row $r: every step trains the same $mb x $seq batch ($t_accum micro-batch(es) of $t_mb)
task: finetune
device: cuda
model:
  path: "$2"
  dtype: bfloat16
adapter:
  r: $lora_r
  alpha: $lora_alpha
  dropout: $lora_dropout
  target_modules: all-linear
data:
  train: "$3"
  format: tokens
  max_seq_len: $seq
  shuffle: false
  cache: false
training:
  max_steps: $((warmup + steps))
  micro_batch_size: $t_mb
  gradient_accumulation_steps: $t_accum
  learning_rate: 1.0e-4
  lr_scheduler: constant
  warmup_steps: 0
  weight_decay: 0.01
  max_grad_norm: 0
  log_every: 1
  checkpoint_every: 0
${extra}
output:
  dir: "$4"
EOF
}

# Where a trainerd row's step time goes: a run of warmup + 2 steps whose last two are traced, and
# the summary of the trace by kind of kernel, kernel and operator (trace_summary.py).
profile_row() {  # row, the row's run base; leaves the measurement's rc and wall as they were
  local base=$2.profile summary=$results/profile-$1.txt first=$((warmup + 1)) rc wall
  ( steps=2; write_job "$base.yaml" "$model" "$tokens" "$base.out" )
  rm -rf "$base.out"
  say "row $1: profiling steps $first-$((first + 1)) of trainerd"
  if run_timed "$base.log" "$worker" run "$base.yaml" --profile "$base.trace.json" --profile-steps "$first-$((first + 1))" &&
     [ "$rc" = 0 ] && python3 "$here/trace_summary.py" "$base.trace.json" --steps 2 --ops 40 --gaps 15 > "$summary" 2>&1; then
    [ -n "$out" ] && cp "$summary" "$out/"
    head -3 "$summary"
  else
    fail "row $1: the profile failed (log: $base.log)"
    tail -3 "$base.log"
  fi
}

skipped=() failed=()
for r in $rows; do
  row_def "$r"
  model=$work/models/$model_name
  tokens=$work/tokens-${mb}x${seq}.jsonl
  [ -f "$tokens" ] || python3 "$here/speed_util.py" tokens --micro-batch "$mb" --seq "$seq" --out "$tokens" ||
    { fail "could not write $tokens; row $r skipped"; continue; }
  for s in $systems; do
    [[ " ${todo[*]} " == *" $r:$s "* ]] || continue
    if ! model_ok "$model_name"; then
      fail "row $r, $s: no $model_name folder; skipped"
      skipped+=("$r:$s")
      continue
    fi
    if ! fits "$(estimate "$r:$s")"; then
      say "row $r, $s: skipped, would pass BUDGET_S=$budget (continue with KEEP=1)"
      skipped+=("$r:$s")
      continue
    fi
    base=$work/runs/$r.$s
    metrics= settings=
    say "row $r ($shape, $mb x $seq, checkpointing $ckpt): $s"
    if [ "$s" = trainerd ]; then
      if [ "$trainerd_ok" != 1 ]; then
        echo "no trainerd-worker (the build failed or NO_BUILD=1 without one)" > "$base.log"
        rc=1 wall=0
      else
        rm -rf "$base.out"
        write_job "$base.yaml" "$model" "$tokens" "$base.out"
        run_timed "$base.log" "$worker" run "$base.yaml"
        metrics=$base.out/metrics.jsonl
        settings="micro-batch $t_mb"
        [ "$t_accum" -gt 1 ] && settings="$t_accum micro-batches of $t_mb"
        [ -n "$TRAINERD_EXTRA_YAML" ] && settings="$settings; $(printf '%s' "$TRAINERD_EXTRA_YAML" | sed ':a;N;$!ba;s/\n/, /g')"
        # Passes in the Hopper GEMM's epilogues (engine/epilogue_gemm.h; on by default for bf16 on a Hopper GPU): the
        # table says how many products the GEMM took in the first step (the worker's note; it declines shapes
        # it does not suit).
        setting='TRAINERD_HOPPER_[A-Z_]*=[0-9]\( (the default here)\)\?'
        taken=$(grep -o "$setting\(, $setting\)*: the first step ran .* of the Hopper GEMM" "$base.log" |
                head -1 | sed 's/: the first step ran \(.*\) of the Hopper GEMM/ (first step: \1 on it)/')
        [ -n "$taken" ] && settings="$settings; $taken"
        # Attention on the Hopper kernels of our own (on by default where they take it): the worker's note.
        note='TRAINERD_HOPPER_ATTENTION=1\( (the default here)\)\?: the first step ran attention in [0-9]* forwards'
        taken=$(grep -o "$note" "$base.log" | head -1 |
                sed 's/: the first step ran attention in \([0-9]*\) forwards/ (first step: \1 attention forwards on it)/')
        [ -z "$taken" ] && [ "${TRAINERD_HOPPER_ATTENTION:-}" = 1 ] &&
          taken="TRAINERD_HOPPER_ATTENTION=1 (no note of the forwards taken)"
        [ -n "$taken" ] && settings="$settings; $taken"
        [ "$profile" = 1 ] && [ "$rc" = 0 ] && profile_row "$r" "$base"
      fi
    else
      args=(--model-dir "$model" --micro-batch "$mb" --seq "$seq" --tokens "$tokens" --warmup "$warmup" --steps "$steps"
            --rank "$lora_r" --alpha "$lora_alpha" --lora-dropout "$lora_dropout")
      [ "$ckpt" = 1 ] && args+=(--grad-ckpt)
      [ "$s" = hf-compile ] && args+=(--compile)
      run_timed "$base.log" python3 "$here/hf_peft_baseline.py" "${args[@]}"
    fi
    python3 "$here/speed_util.py" result "$s" $(row_args) \
      --warmup "$warmup" --steps "$steps" --model-dir "$model" ${metrics:+--metrics "$metrics"} \
      --log "$base.log" --power "$base.log.power.csv" --rc "$rc" --wall-s "$wall" ${settings:+--settings "$settings"} \
      --ceiling "$results/ceiling.json" \
      --versions "$results/versions.json" --out "$(result_file "$r" "$s")" ||
      { fail "row $r, $s failed (exit status $rc after ${wall} s; log: $base.log); its last lines:"
        tail -8 "$base.log"; failed+=("$r:$s"); }
    report
  done
done

report
echo
cat "$work/speed.md"
if [ ${#skipped[@]} -gt 0 ]; then
  echo
  say "not run this time: ${skipped[*]}; to continue on this warm machine:"
  echo "  KEEP=1 BUILD_DIR=$build WORK_DIR=$work ROWS=\"$rows\" SYSTEMS=\"$systems\" bash $here/run.sh"
fi
[ ${#failed[@]} -gt 0 ] && say "failed: ${failed[*]} (logs in $work/runs)"
say "done: results in $results${out:+, speed.md results.json run.log in $out}"
[ ${#skipped[@]} -eq 0 ] && [ ${#failed[@]} -eq 0 ]  # the exit status: 0 when every selected part has a good result
}

# Exit status: 0 when every selected row and system has a good result, 1 when one failed or was not
# run, 2 for unknown ROWS/SYSTEMS. Everything also goes to run.log (in $OUT when set: it comes back even from a command cut short).
main 2>&1 | tee -a "${out:-$work}/run.log"
exit "${PIPESTATUS[0]}"
