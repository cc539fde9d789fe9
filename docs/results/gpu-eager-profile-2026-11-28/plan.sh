#!/bin/bash
# GPU plan for issue 67, item 1 (2026-11-28): where patched 0.5.12.post1's decode step spends
# its extra time. One H100 (nvidia-h100-x1), sglang's profiler (--profile-batch), counters off
# (PK_E2E_COUNTERS_OFF=1), the small shape (vocab 128256, context 131072), release defaults
# otherwise (piecewise CUDA graph as the release leaves it), cuda_graph_max_bs 8 in every engine:
# bs 8 replays its captured graph, bs 16 runs eager. One engine per variant and backend,
# pristine then patched (one round: the profile, not the ratio, is what this plan is for):
#   prof-triton  --attention-backend triton      bs 8 (largest captured) and 16 (eager)
#   prof-fa3     no backend named (FA3 on Hopper) bs 8 (captured, faster patched) and 16 (eager)
# Each profiled batch: 20 decode steps (profile_run.steps_to_profile) after 3 timed generates of
# 128 new tokens. The traces stay in /tmp/pk_gpu_e2e/results/*.profile-*; each step's DECODE
# traces are tarred into $R/traces-<step>.tgz for the polls to bring back.
#
# Started once, in the background (setsid), by the call that brings the bundle ($B). The FA3
# step waits for FA3's library (fa3_kernel.py unpack, a later call) and runs after Triton.
R=${R:-/tmp/pkrun}
B=${B:-/tmp/b12}
FA3=${FA3:-/tmp/pk_fa3/flash_ops.abi3.so}
GIVE_UP_S=${GIVE_UP_S:-1200}
STEPS=${STEPS:-"prof-triton prof-fa3"}
export PK_E2E_COUNTERS_OFF=1
LOW='{"cuda_graph_max_bs": 8}'
mkdir -p "$R"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }

orchestrate() {  # name timeout_s args...
  local name=$1 tmo=$2; shift 2
  mkdir -p "$R/$name" /tmp/pk_gpu_e2e/results; touch "$R/$name/.start"; note "start $name"
  (cd "$B" && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "$tmo" \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out "$R/$name" "$@" \
     > "$R/$name/console.log" 2>&1)
  local rc=$?
  note "end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1); $(grep -c '^PROBLEM' "$R/$name/console.log") problem lines)"
  (cd /tmp/pk_gpu_e2e/results && find . -name '*DECODE*' -newer "$R/$name/.start" | tar czf "$R/traces-$name.tgz" -T - ) 2>>"$R/progress.log"
  note "traces-$name.tgz $(du -k "$R/traces-$name.tgz" | cut -f1) KiB"
  touch "$R/$name/.done"
}

common=(--releases 0.5.12.post1 --sizes small --batch-sizes 8,16 --engine-extra "$LOW"
        --profile-batch 8,16 --runs 3 --max-new-tokens 128 --run-timeout 330)
note "plan: $STEPS"
for s in $STEPS; do
  case $s in
    prof-triton) orchestrate "$s" 760 "${common[@]}" --label ptri --attention-backend triton ;;
    prof-fa3)
      while [ ! -e "$(dirname "$FA3")/fa3.json" ]; do
        [ $SECONDS -ge "$GIVE_UP_S" ] && { note "gave up on $s (no FA3 library)"; continue 2; }
        note "waiting for FA3's library"; sleep 10
      done
      orchestrate "$s" 760 "${common[@]}" --label pfa3 --attention-backend default --fa3-lib "$FA3" ;;
  esac
done
note "all done"
