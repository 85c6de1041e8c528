#!/usr/bin/env bash
# trainerd alone on one row of run.sh at several settings of the Hopper GEMM's epilogues
# (engine/epilogue_gemm.h), in turn on one warm machine, so that each setting is measured beside the
# others on the same start (the card's clock and power vary between starts, not within one). From the
# repository root on the GPU machine, with .devroot carried:
#
#   bash bench/speed/settings.sh
#   SETTINGS="0,0 1,0 0,0 1,0" ROW=8b bash bench/speed/settings.sh
#
# Environment (all optional):
#   SETTINGS   space-separated G,R, G,R,A or G,R,A,D: TRAINERD_HOPPER_GEMM=G (0 to 3), TRAINERD_HOPPER_ROPE=R
#              (0 or 1), TRAINERD_HOPPER_ATTENTION=A (0 or 1; without A unset: the engine's default, on for
#              bf16 on a Hopper GPU; engine/hopper_attention.h) and TRAINERD_HOPPER_DOWN_LORA=D (0 or 1;
#              without D unset: off; engine/epilogue_gemm.h), run in
#              this order; default "0,0 1,0 2,0 0,1 2,1 0,0 1,0 2,0 0,1 2,1"
#   ROW        the row of run.sh (default 8b)
#   BUDGET_S   start no further setting after this many seconds (default 0: run them all)
#   and run.sh's own (BUILD_DIR, NO_BUILD, WORK_DIR, RUN_TIMEOUT_S, ...): the first setting builds the
#   worker if run.sh would, the others reuse it (NO_BUILD=1)
# Exit status: 2 for a malformed setting (nothing runs), 1 when a setting's run failed, else 0.
# Prints, per setting, run.sh's trainerd line (step time, tokens/s, the products the GEMM took in the
# first step); run.sh's whole output per setting in $WORK_DIR/settings/ (default /tmp/trainerd-speed).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
settings=${SETTINGS:-"0,0 1,0 2,0 0,1 2,1 0,0 1,0 2,0 0,1 2,1"}
row=${ROW:-8b}
budget=${BUDGET_S:-0}
logs=${WORK_DIR:-/tmp/trainerd-speed}/settings
mkdir -p "$logs"
no_build=${NO_BUILD:-0}
for s in $settings; do
  case "$s" in [0-3],[01] | [0-3],[01],[01] | [0-3],[01],[01],[01]) ;;
    *) echo "error: setting '$s' is not G,R, G,R,A or G,R,A,D with G in 0-3, R, A and D in 0-1"; exit 2 ;;
  esac
done
failed=0
for s in $settings; do
  IFS=, read -r gemm rope attention down_lora <<< "$s"
  if [ "$budget" -gt 0 ] && [ "$SECONDS" -ge "$budget" ]; then echo "BUDGET_S reached: not run: $s and after"; break; fi
  log=$logs/$row-gemm$gemm-rope$rope-attention${attention:-default}-down${down_lora:-default}-$SECONDS.txt
  attention_env=(-u TRAINERD_HOPPER_ATTENTION)
  [ -n "$attention" ] && attention_env=(TRAINERD_HOPPER_ATTENTION="$attention")
  down_env=(-u TRAINERD_HOPPER_DOWN_LORA)
  [ -n "$down_lora" ] && down_env=(TRAINERD_HOPPER_DOWN_LORA="$down_lora")
  env "${attention_env[@]}" "${down_env[@]}" TRAINERD_HOPPER_GEMM="$gemm" TRAINERD_HOPPER_ROPE="$rope" ROWS="$row" \
    SYSTEMS=trainerd NO_BUILD="$no_build" \
    bash bench/speed/run.sh > "$log" 2>&1 || failed=1
  echo "== TRAINERD_HOPPER_GEMM=$gemm TRAINERD_HOPPER_ROPE=$rope TRAINERD_HOPPER_ATTENTION=${attention:-(default)}" \
    "TRAINERD_HOPPER_DOWN_LORA=${down_lora:-(default)}" \
    "(at $SECONDS s; $log)"
  grep -E '^\|.*trainerd|ERROR' "$log" | head -3
  no_build=1  # built (or not buildable) by the first setting
done
exit "$failed"  # 1 when a setting's run did not give its result
