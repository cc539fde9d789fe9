#!/bin/bash
# Issue 40's GPU proof (planned 2026-11-26): sglang's default server settings (piecewise
# CUDA graph as the release leaves it, no --attention-backend: FA3 on Hopper), the
# checkpoint-shaped EAGLE3 draft (draft vocab 32000 + d2t), Llama-3.1 context (131072).
# What was in force is read back per engine: settings.md of each step.
#
# Started once, in the background, by the first device call (see calls.md beside this):
#   mkdir -p /tmp/pkrun && cp docs/results/gpu-2026-11-26/plan.sh /tmp/pkplan.sh &&
#   setsid nohup bash /tmp/pkplan.sh > /tmp/pkrun/plan.log 2>&1 < /dev/null &
# Later calls bring what later steps wait for (/tmp/pk_fa3/fa3.json, /tmp/b10/manifest.json)
# and tar /tmp/pkrun into $OUT. Steps run in priority order; a step whose inputs are not
# there yet is put back and tried again after the others. Each step leaves .done, so the
# script can be started again (same machine) and goes on where it stopped.
#
# Knobs (environment): STEPS (which steps, in this order; default all, as below),
# ROUNDS_SMALL (ABBA engine-process rounds of the small FA3 pair; default 3),
# B12 / B10 (the 0.5.12.post1 and 0.5.10 bundles), FA3 (flash_ops.abi3.so), R (results),
# WAIT_S (how long a step may wait for inputs before it is put back; default 60),
# GIVE_UP_S (after this long, steps still without inputs are dropped; default 3000).
#
# Estimated GPU wall time per step (engine start with piecewise capture 60-150 s, then
# 2 batch sizes x 6 generates): small pair ~5 min, 8b pair ~7 min.
#   s12-triton   ~5   0.5.12.post1 small, Triton, pristine vs patched      (needs no FA3: runs first)
#   s12-fa3      ~5/round  0.5.12.post1 small, default backend (FA3), pristine vs patched, ROUNDS_SMALL rounds
#   b12-fa3      ~7   0.5.12.post1 8b, default backend (FA3), pristine vs patched
#   s12-notopk   ~5   0.5.12.post1 small, default backend: every patch but draft-extend-graph-no-topk vs every patch
#   s10-fa3      ~5   0.5.10 small, default backend, pristine vs patched
#   b12-triton   ~7   0.5.12.post1 8b, Triton
#   s10-triton   ~5   0.5.10 small, Triton
# Second machine (run after the first: its pairs were single rounds):
#   s12-triton-rounds  0.5.12.post1 small, Triton, ROUNDS_SMALL ABBA rounds
#   s12-notopk-rounds  every patch but draft-extend-graph-no-topk vs every patch, ROUNDS_SMALL rounds
#   s11-fa3, s11-triton  0.5.11 small (piecewise CUDA graph on by default there too)
# Default (ROUNDS_SMALL=3): ~49 min. One machine goes back after 30 min held: on the first,
# STEPS="s12-triton s12-fa3 b12-fa3" (~27 min); on a second, the rest (~22 min).
R=${R:-/tmp/pkrun}
B12=${B12:-/tmp/b12}
B10=${B10:-/tmp/b10}
B11=${B11:-/tmp/b11}
FA3=${FA3:-/tmp/pk_fa3/flash_ops.abi3.so}
ROUNDS_SMALL=${ROUNDS_SMALL:-3}
WAIT_S=${WAIT_S:-60}
GIVE_UP_S=${GIVE_UP_S:-3000}
STEPS=${STEPS:-"s12-triton s12-fa3 b12-fa3 s12-notopk s10-fa3 b12-triton s10-triton"}
NOTOPK=draft-extend-graph-no-topk
mkdir -p "$R"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }

ready() {  # bundle [fa3]: are this step's inputs there?
  [ -e "$1/manifest.json" ] || return 1
  [ "$2" != fa3 ] || [ -e "$(dirname "$FA3")/fa3.json" ]
}

orchestrate() {  # name bundle timeout_s args...
  local name=$1 bundle=$2 tmo=$3; shift 3
  mkdir -p "$R/$name"; note "start $name"
  (cd "$bundle" && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "$tmo" \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out "$R/$name" --batch-sizes 1,8 --runs 5 "$@" \
     > "$R/$name/console.log" 2>&1)
  local rc=$?
  note "end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1))"
  touch "$R/$name/.done"
}

step() {  # name: run it when its inputs are there (return 2: not yet)
  [ -e "$R/$1/.done" ] && return 0
  local fa3=(--attention-backend default --fa3-lib "$FA3")
  case $1 in
    s12-triton) ready "$B12" || return 2
      orchestrate "$1" "$B12" 700 --releases 0.5.12.post1 --sizes small --attention-backend triton --run-timeout 330 ;;
    s12-fa3) ready "$B12" fa3 || return 2
      orchestrate "$1" "$B12" $((ROUNDS_SMALL * 700)) --releases 0.5.12.post1 --sizes small "${fa3[@]}" \
        --rounds "$ROUNDS_SMALL" --run-timeout 330 ;;
    b12-fa3) ready "$B12" fa3 || return 2
      orchestrate "$1" "$B12" 1000 --releases 0.5.12.post1 --sizes 8b "${fa3[@]}" --run-timeout 480 ;;
    s12-notopk) ready "$B12" fa3 || return 2
      orchestrate "$1" "$B12" 700 --releases 0.5.12.post1 --sizes small "${fa3[@]}" --run-timeout 330 \
        --variants "minus-$NOTOPK,patched" --compare "minus-$NOTOPK,patched" ;;
    s12-triton-rounds) ready "$B12" || return 2
      orchestrate "$1" "$B12" $((ROUNDS_SMALL * 500)) --releases 0.5.12.post1 --sizes small --attention-backend triton \
        --rounds "$ROUNDS_SMALL" --run-timeout 330 ;;
    s12-notopk-rounds) ready "$B12" fa3 || return 2
      orchestrate "$1" "$B12" $((ROUNDS_SMALL * 500)) --releases 0.5.12.post1 --sizes small "${fa3[@]}" --run-timeout 330 \
        --variants "minus-$NOTOPK,patched" --compare "minus-$NOTOPK,patched" --rounds "$ROUNDS_SMALL" ;;
    s11-fa3) ready "$B11" fa3 || return 2
      orchestrate "$1" "$B11" 700 --releases 0.5.11 --sizes small "${fa3[@]}" --run-timeout 330 ;;
    s11-triton) ready "$B11" || return 2
      orchestrate "$1" "$B11" 700 --releases 0.5.11 --sizes small --attention-backend triton --run-timeout 330 ;;
    s10-fa3) ready "$B10" fa3 || return 2
      orchestrate "$1" "$B10" 700 --releases 0.5.10 --sizes small "${fa3[@]}" --run-timeout 330 ;;
    b12-triton) ready "$B12" || return 2
      orchestrate "$1" "$B12" 1000 --releases 0.5.12.post1 --sizes 8b --attention-backend triton --run-timeout 480 ;;
    s10-triton) ready "$B10" || return 2
      orchestrate "$1" "$B10" 700 --releases 0.5.10 --sizes small --attention-backend triton --run-timeout 330 ;;
    *) note "unknown step $1"; return 0 ;;
  esac
}

note "plan: $STEPS (ROUNDS_SMALL=$ROUNDS_SMALL)"
pending=($STEPS)
while [ ${#pending[@]} -gt 0 ]; do
  later=()
  for s in "${pending[@]}"; do
    waited=0
    while ! step "$s"; do  # inputs not there: wait a little, then put it back
      [ $waited -ge "$WAIT_S" ] && { later+=("$s"); note "waiting for inputs of $s"; break; }
      sleep 10; waited=$((waited + 10))
    done
  done
  if [ ${#later[@]} -gt 0 ] && [ $SECONDS -ge "$GIVE_UP_S" ]; then
    note "gave up on: ${later[*]} (inputs never came)"; break
  fi
  [ ${#later[@]} -eq ${#pending[@]} ] && sleep 30  # nothing could run: inputs still on their way
  pending=("${later[@]}")
done
note "all done"
