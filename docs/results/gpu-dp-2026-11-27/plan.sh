#!/bin/bash
# GPU plan for issue 58 (planned 2026-11-27): DeepSeek-V3-shaped MLA with its MTP draft
# (gpu_e2e/deepseek.py, --sizes ds --scenario mtp: NEXTN, no draft path) at TP 4 on one
# 4-GPU machine (nvidia-h100-x4 or nvidia-h200-x4), 0.5.12.post1, pristine vs patched, on
# the release's defaults (no --attention-backend: FA3 on Hopper, read back in settings.md)
# plus the scale settings:
#   dp-tp4   --tp 4                                  (TP only; decision False expected)
#   dp-dpa   --tp 4 --dp 4 --dp-attention            (DP attention 4; decision False expected)
#   dp-tbo   --tp 4 --dp 4 --dp-attention --tbo --moe-a2a-backend deepep
#            The image has no deep_ep (device KINDS.md's package list) and the bundle
#            carries none (not on PyPI): this pair is expected to FAIL at start-up, and the
#            orchestrator records the failure line it reads back (results.json
#            runs[...].engine_failure, a "PROBLEM: ... the engine did not run" line).
#            Were it to run: decision True expected on every rank (TBO keeps the mirror,
#            docs/research/dp-attention.md).
# Workloads (each step): bs 1 (DP attention: one rank busy per run, the other three idle
# every step: sglang #33973's shape), bs 8 (two requests per DP rank) and bs 48 eager:
# cuda_graph_max_bs lowered to 8 (also keeps each start's capture short), so bs 48 (12 per
# DP rank) runs every busy rank's eager metadata path. 128 new tokens, one warm-up and 2
# timed generates per batch size; ranks.md: per rank, decision, prepare_for_decode syncs
# per busy step, host waits per worker step (torch's count; wrapper counter beside), busy /
# idle steps before -> after.
# Estimated engine time on 4 H100s: dp-tp4 and dp-dpa ~4-5 min each (two engine starts of
# 1-2 min with NCCL set-up on 4 GPUs), dp-tbo ~1-2 min (two starts that stop early): ~12 min.
#
# Started once, in the background, by the first device call (setsid), after copying the
# carried bundle to $B and FA3's library (fa3-pack, unpacked by fa3_kernel.py, with its
# fa3.json beside it) to $(dirname $FA3). Later calls bring what a step waits for and tar
# /tmp/pkrun into $OUT. A step whose inputs are not there yet is put back and tried after
# the others. Each step leaves .done.
R=${R:-/tmp/pkrun}
B=${B:-/tmp/bdp}
FA3=${FA3:-/tmp/pk_fa3/flash_ops.abi3.so}
WAIT_S=${WAIT_S:-20}
GIVE_UP_S=${GIVE_UP_S:-2400}
STEPS=${STEPS:-"dp-tp4 dp-dpa dp-tbo"}
LOW='{"cuda_graph_max_bs": 8}'
mkdir -p "$R"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }

ready() {  # bundle fa3-lib: are this step's inputs there?
  [ -e "$1/manifest.json" ] && [ -e "$(dirname "$2")/fa3.json" ]
}

orchestrate() {  # name bundle timeout_s args...
  local name=$1 bundle=$2 tmo=$3; shift 3
  mkdir -p "$R/$name"; note "start $name"
  (cd "$bundle" && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "$tmo" \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out "$R/$name" "$@" \
     > "$R/$name/console.log" 2>&1)
  local rc=$?
  note "end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1); $(grep -c '^PROBLEM' "$R/$name/console.log") problem lines; $(grep -h 'engine failed' "$R/$name/console.log" | head -1))"
  touch "$R/$name/.done"
}

step() {  # name: run it when its inputs are there (return 2: not yet)
  [ -e "$R/$1/.done" ] && return 0
  ready "$B" "$FA3" || return 2
  local ds=(--releases 0.5.12.post1 --scenario mtp --sizes ds --tp 4 --attention-backend default
            --fa3-lib "$FA3" --engine-extra "$LOW" --max-new-tokens 128 --runs 2)
  case $1 in
    dp-tp4) orchestrate "$1" "$B" 900 "${ds[@]}" --batch-sizes 1,8,48 --run-timeout 420 ;;
    dp-dpa) orchestrate "$1" "$B" 900 "${ds[@]}" --batch-sizes 1,8,48 --run-timeout 420 \
              --dp 4 --dp-attention ;;
    dp-tbo) orchestrate "$1" "$B" 600 "${ds[@]}" --batch-sizes 1,8,48 --run-timeout 280 \
              --dp 4 --dp-attention --tbo --moe-a2a-backend deepep ;;
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
