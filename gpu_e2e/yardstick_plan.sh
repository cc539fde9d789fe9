#!/bin/bash
# The yardstick's one-GPU plan (issue 57: upstream 0.5.17 as the yardstick; was
# docs/results/gpu-yardstick/plan.sh). First run 2026-11-27 (second session: steps fa3-r1
# triton-r1 fa3-r2 fa3-r3 triton-r2 triton-r3, the copy then kept beside its results:
# `git show bbe1fd9:docs/results/gpu-yardstick-2026-11-27/plan.sh`); this version adds the
# later sessions' steps. For several GPUs at once, gpu_e2e/plan.sh (one lane per GPU).
# One GPU (status's kind: nvidia-h200, or an H100), one background script. Every engine: sglang's defaults as the
# harness runs them (piecewise CUDA graph as each release leaves it; no attention backend named
# in the FA3 steps, so Hopper picks FA3, read back in settings.md; Triton named in the Triton
# steps), the checkpoint-shaped EAGLE3 draft, the models' own context (131072), batch sizes
# 1, 8 and 32 (captured: the harness asks cuda_graph_max_bs 32, which 0.5.17 takes as
# cuda_graph_max_bs_decode, gpu_e2e/server_args_names.py), uniform workload, 256 new tokens,
# 3 timed generates per batch size, mem_fraction_static 0.6, greedy, ignore_eos.
#
# A step is named BACKEND[_KIND]-rN: BACKEND fa3 (no backend named) or triton; KIND none
# (the small shape, sync counters on), `off` (the small shape with the counters off:
# PK_E2E_COUNTERS_OFF, no wrappers and no sync debug mode, so the timing carries none of the
# instrument's host cost; pristine runs too, and round 1 profiles bs 8 with sglang's profiler
# in every variant: GPU busy fraction per decode step), `8b` (the 8B shape, patched against
# 0.5.17) or `8boff` (the 8B shape, counters off, round 1 profiled at bs 32). Round 1 of the small shape also runs bs 48 above cuda_graph_max_bs 32 (eager),
# pristine beside patched, and profiles bs 8.
#
# Three variants: pristine and patched 0.5.12.post1 (bundle B12, patchkit's own) and upstream
# 0.5.17 (bundle B17, `bundle --reference 0.5.17`, carried as published: variant "upstream").
# The orchestrator runs one release per call, so a step is two calls, one per bundle, whose
# order flips every round (ABBA: r1 and r3 B12 first, r2 B17 first). Each call's
# results.json keeps its runs; the patched-vs-0.5.17 ratio per round and its interval are
# read from them afterwards (python -m gpu_e2e.yardstick RESULTS).
#
# VARIANTS12 (fifth lease, issue 57's per-patch A/B): the trees of B12 every step runs instead,
# e.g. "minus-verify-wait-on-stream,patched" (a bundle built with --minus: every patch but
# that one, beside all of them, in one call, the order flipping with the round).
#
# NO_PROFILE=1 (sixth lease): no profiled generate in any step, for more rounds a lease; the
# bundles of that lease also time each batch's first token (timed_calls.first_token_runs), so
# the decode alone's tok/s is read beside the whole generate's.
#
# Each bundle has its own FA3 library: sglang-kernel 0.4.2.post2's for B12, 0.4.5's for B17
# (`fa3-pack --kernel-version`); the orchestrator refuses a library of another version.
#
# Started once, in the background, by the call that brings B12 (docs/gpu.md, "0.5.17
# yardstick"); the calls before bring the parts of B17 and FA3's libraries. A step whose
# inputs are not there yet is put back and tried after the others; Triton steps need no FA3
# library, so they run first if the FA3 parts come late. A step done on an earlier machine
# (`.done`) is skipped.
R=${R:-/tmp/pkrun}
B12=${B12:-/tmp/b12}
B17=${B17:-/tmp/b17}
FA3_12=${FA3_12:-/tmp/pk_fa3/flash_ops.abi3.so}
FA3_17=${FA3_17:-/tmp/pk_fa3_17/flash_ops.abi3.so}
WAIT_S=${WAIT_S:-20}
GIVE_UP_S=${GIVE_UP_S:-3300}
# Third lease (2026-11-27, third session): fa3-r3 fa3_off-r1 triton-r2 fa3_8b-r1 triton-r3
# triton_8b-r1 triton_off-r1, in that order.
# Fourth lease (the same session): 8B with the counters off, two ABBA rounds per backend.
# Fifth lease (fourth session): the A/B of verify-wait-on-stream at 8B, counters off (three
# ABBA rounds a backend) and on (one round, for the event waits), with VARIANTS12 set.
STEPS=${STEPS:-"fa3_8boff-r1 triton_8boff-r1 fa3_8b-r1 fa3_8boff-r2 triton_8boff-r2 triton_8b-r1 fa3_8boff-r3 triton_8boff-r3"}
mkdir -p "$R"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }

ready() {  # bundle [fa3-lib]: are its inputs there? (a joined bundle is there only once whole)
  [ -e "$1/manifest.json" ] && { [ -z "$2" ] || [ -e "$(dirname "$2")/fa3.json" ]; }
}

orchestrate() {  # name bundle timeout_s args...
  local name=$1 bundle=$2 tmo=$3; shift 3
  [ -e "$R/$name/.done" ] && { note "skip $name (ran on an earlier machine)"; return; }
  mkdir -p "$R/$name"; note "start $name"
  (cd "$bundle" && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "$tmo" \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out "$R/$name" "$@" \
     > "$R/$name/console.log" 2>&1)
  local rc=$?
  [ $rc = 0 ] && touch "$R/$name/.done"
  note "end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1); $(grep -c '^PROBLEM' "$R/$name/console.log") problem lines)"
}

run12() {  # name variants round backend-args...: 0.5.12.post1's trees
  local name=$1 variants=$2 rnd=$3; shift 3
  orchestrate "$name-b12" "$B12" 1500 --releases 0.5.12.post1 --variants "$variants" --label "$rnd" "$@"
}

run17() {  # name round backend-args...: upstream 0.5.17
  local name=$1 rnd=$2; shift 2
  orchestrate "$name-b17" "$B17" 1200 --releases 0.5.17 --label "$rnd" "$@"
}

profile() {  # batch size: the arguments that profile it, none with NO_PROFILE
  [ -z "$NO_PROFILE" ] && echo "--profile-batch $1"
}

step() {  # name: run it when its inputs are there (return 2: not yet)
  [ -e "$R/$1/.done" ] && return 0
  local head=${1%-r*} rnd=${1##*-}
  local backend=${head%%_*} kind="" size=small variants=patched
  [ "$head" != "$backend" ] && kind=${head#*_}
  case $kind in *8b*) size=8b ;; esac
  local common=(--sizes $size --batch-sizes 1,8,32 --runs 3 --run-timeout 560)
  case $kind in
    *off*) [ "$rnd" = r1 ] && [ "$size" = small ] && { common+=($(profile 8)); variants=pristine,patched; }
           # 8B profiles bs 32, the last batch size: 0.5.17 once died after a profile
           # (free(): invalid next size), and the timed batches before it are written first
           [ "$rnd" = r1 ] && [ "$size" = 8b ] && common+=($(profile 32)) ;;
    "")    if [ "$rnd" = r1 ]; then variants=pristine,patched
             common=(--sizes small --batch-sizes 1,8,32,48 --engine-extra '{"cuda_graph_max_bs": 32}'
                     --runs 3 --run-timeout 560 $(profile 8)); fi ;;
  esac
  [ -n "$VARIANTS12" ] && variants=$VARIANTS12
  [ "$rnd" = r2 ] && [ -n "$VARIANTS12" ] && variants=$(echo "$variants" | tr ',' '\n' | tac | paste -sd,)
  local a12=("${common[@]}") a17=("${common[@]}")
  [ -n "$VARIANTS12" ] && a12+=(--compare "$VARIANTS12")
  if [ "$backend" = fa3 ]; then
    ready "$B12" "$FA3_12" && ready "$B17" "$FA3_17" || return 2
    a12+=(--attention-backend default --fa3-lib "$FA3_12"); a17+=(--attention-backend default --fa3-lib "$FA3_17")
  else
    ready "$B12" && ready "$B17" || return 2
    a12+=(--attention-backend triton); a17+=(--attention-backend triton)
  fi
  mkdir -p "$R/$1"
  local counters=""; case $kind in *off*) counters=1 ;; esac
  case $rnd in  # ABBA: the start order flips every round
    r2) PK_E2E_COUNTERS_OFF=$counters run17 "$1" "$rnd" "${a17[@]}"
        PK_E2E_COUNTERS_OFF=$counters run12 "$1" "$variants" "$rnd" "${a12[@]}" ;;
    *)  PK_E2E_COUNTERS_OFF=$counters run12 "$1" "$variants" "$rnd" "${a12[@]}"
        PK_E2E_COUNTERS_OFF=$counters run17 "$1" "$rnd" "${a17[@]}" ;;
  esac
  touch "$R/$1/.done"
}

note "plan: $STEPS"
# Always the first step, in STEPS' order, whose inputs are there: a step that waited for its
# inputs runs as soon as they come, before the steps listed after it.
pending=($STEPS)
while [ ${#pending[@]} -gt 0 ]; do
  ran=""
  for s in "${pending[@]}"; do
    if step "$s"; then ran=$s; break; fi
  done
  if [ -n "$ran" ]; then
    rest=(); for s in "${pending[@]}"; do [ "$s" = "$ran" ] || rest+=("$s"); done; pending=("${rest[@]}")
    continue
  fi
  [ $SECONDS -ge "$GIVE_UP_S" ] && { note "gave up on: ${pending[*]} (inputs never came)"; break; }
  note "waiting for inputs of: ${pending[*]}"; sleep "$WAIT_S"
done
note "all done"
