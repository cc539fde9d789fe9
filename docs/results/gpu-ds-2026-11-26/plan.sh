#!/bin/bash
# Issue 44's GPU proof (planned 2026-11-26): DeepSeek-V3-shaped MLA with its MTP draft
# (gpu_e2e/deepseek.py: vocab 129280, context 163840, kv_lora_rank 512, rope 64, one dense
# and three MoE layers, NEXTN with no draft path) on the release's defaults (no
# --attention-backend: FA3 read back) and on FlashMLA (page size 64); FA3 tree drafts
# (Llama small, topk 4, 8 draft tokens) with an eager batch above cuda_graph_max_bs and
# long prompts; compute-sanitizer memcheck on a short patched run. Pristine vs patched.
#
# Started once, in the background, by the first device call (calls.md beside this). It
# travels inside the carried bundle (the device call sends the session's checkout, not
# this branch): the first call copies it to /tmp/pkplan.sh. Later calls bring what later
# steps wait for (/tmp/pk_fa3/fa3.json, /tmp/pk_kern/kernels/kernels.json,
# /tmp/b10/manifest.json) and tar /tmp/pkrun into $OUT. Each step leaves .done.
#
# Knobs: STEPS, R, B12, B10, FA3, KERN, WAIT_S, GIVE_UP_S (as issue 40's plan.sh).
# Estimated GPU wall time: each DeepSeek pair ~6 min (two engine starts, FlashMLA's first
# also JIT-builds FlashInfer's MLA prefill), tree pair ~6 min, memcheck <= 9 min.
#   d12-fa3      0.5.12.post1 ds (MoE), default backend (FA3 on Hopper), pristine vs patched
#                (if an MoE kernel fails on the image: ds-dense for every DeepSeek step after)
#   d12-fmla     0.5.12.post1 ds, FlashMLA, page size 64
#   t12-tree     0.5.12.post1 small Llama, FA3, topk 4 / 8 draft tokens, context 4096,
#                cuda_graph_max_bs 4: bs 1, 4 (captured) and 16 (eager), 1536-token prompts
#   t12-memcheck the same settings, patched only, bs 16, 16 new tokens, piecewise off,
#                under compute-sanitizer --tool memcheck
#   d10-fa3, d10-fmla  0.5.10, as the 0.5.12.post1 steps
R=${R:-/tmp/pkrun}
B12=${B12:-/tmp/b12}
B10=${B10:-/tmp/b10}
FA3=${FA3:-/tmp/pk_fa3/flash_ops.abi3.so}
KERN=${KERN:-/tmp/pk_kern}
WAIT_S=${WAIT_S:-60}
GIVE_UP_S=${GIVE_UP_S:-3000}
STEPS=${STEPS:-"d12-fa3 d12-fmla t12-tree t12-memcheck d10-fa3 d10-fmla"}
TREE='{"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8, "cuda_graph_max_bs": 4, "max_running_requests": 16}'
mkdir -p "$R"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }
ds() { cat "$R/ds_size" 2>/dev/null || echo ds; }

ready() {  # bundle [fa3] [kern]: are this step's inputs there?
  [ -e "$1/manifest.json" ] || return 1; shift
  for need in "$@"; do
    case $need in
      fa3) [ -e "$(dirname "$FA3")/fa3.json" ] || return 1 ;;
      kern) [ -e "$KERN/kernels/kernels.json" ] || return 1 ;;
    esac
  done
}

orchestrate() {  # name bundle timeout_s args...
  local name=$1 bundle=$2 tmo=$3; shift 3
  mkdir -p "$R/$name"; note "start $name"
  (cd "$bundle" && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "$tmo" \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out "$R/$name" "$@" \
     > "$R/$name/console.log" 2>&1)
  local rc=$?
  note "end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1); $(grep -c '^PROBLEM' "$R/$name/console.log") problem lines)"
  touch "$R/$name/.done"
}

moe_failed() {  # name: did an engine of this step stop in an MoE kernel?
  grep -A40 Traceback "$R/$1/engine.log" 2>/dev/null | grep -qiE "fused_moe|moe_align|moe_fused_gate|topk_softmax|fused_experts"
}

deepseek() {  # name bundle backend-args...
  local name=$1 bundle=$2; shift 2
  orchestrate "$name" "$bundle" 1100 --scenario mtp --sizes "$(ds)" --batch-sizes 1,8 --runs 3 --run-timeout 520 "$@"
}

step() {  # name: run it when its inputs are there (return 2: not yet)
  [ -e "$R/$1/.done" ] && return 0
  local fa3=(--attention-backend default --fa3-lib "$FA3")
  local fmla=(--attention-backend flashmla --kernels "$KERN" --engine-extra '{"page_size": 64}')
  local tree=(--sizes small --attention-backend fa3 --fa3-lib "$FA3" --context-length 4096 --engine-extra "$TREE")
  case $1 in
    d12-fa3) ready "$B12" fa3 || return 2
      deepseek "$1" "$B12" --releases 0.5.12.post1 "${fa3[@]}"
      if [ "$(ds)" = ds ] && moe_failed "$1"; then
        echo ds-dense > "$R/ds_size"; note "an MoE kernel failed on this image: ds-dense from here on"
        deepseek d12-fa3-dense "$B12" --releases 0.5.12.post1 "${fa3[@]}"
      fi ;;
    d12-fmla) ready "$B12" kern || return 2
      deepseek "$1" "$B12" --releases 0.5.12.post1 "${fmla[@]}" ;;
    t12-tree) ready "$B12" fa3 || return 2
      orchestrate "$1" "$B12" 1100 --releases 0.5.12.post1 "${tree[@]}" --batch-sizes 1,4,16 --input-len 1536 \
        --max-new-tokens 128 --runs 3 --run-timeout 520 ;;
    t12-memcheck) ready "$B12" fa3 || return 2
      local cs; cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      [ -n "$cs" ] || { note "no compute-sanitizer on this image"; touch "$R/$1/.done"; return 0; }
      mkdir -p "$R/$1"
      export CUDA_LAUNCH_BLOCKING=1  # this step is the last on B12; unset after
      orchestrate "$1" "$B12" 600 --releases 0.5.12.post1 "${tree[@]}" --variants patched \
        --piecewise off --batch-sizes 16 --input-len 1536 --max-new-tokens 16 --runs 1 --run-timeout 560 \
        --wrap "$cs --tool memcheck --target-processes all --print-limit 50 --log-file $R/$1/memcheck.%p.log"
      unset CUDA_LAUNCH_BLOCKING ;;
    d10-fa3) ready "$B10" fa3 || return 2
      deepseek "$1" "$B10" --releases 0.5.10 "${fa3[@]}" ;;
    d10-fmla) ready "$B10" kern || return 2
      deepseek "$1" "$B10" --releases 0.5.10 "${fmla[@]}" ;;
    *) note "unknown step $1"; return 0 ;;
  esac
}

note "plan: $STEPS"
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
  [ ${#later[@]} -eq ${#pending[@]} ] && sleep 20
  pending=("${later[@]}")
done
note "all done"
