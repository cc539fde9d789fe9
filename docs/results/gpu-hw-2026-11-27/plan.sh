#!/bin/bash
# GPU plan for issue 53, second lease (2026-11-27): what the first lease (gpu-hw-2026-11-26) left.
# The bundle is main after init_new's draft-extend copies were pinned (spec-v2-decode-copies) and
# after triton-spec-v2-verify: both measured here for the first time. Every engine: the release's
# defaults (piecewise CUDA graph as the release leaves it, the attention backend it picks unless a
# step names Triton), the checkpoint-shaped EAGLE3 draft, skip_tokenizer_init, greedy, ignore_eos;
# workloads uniform and penalized (frequency and presence penalty 0.5); 3 timed generates per batch.
#
# Eager batches: s12-maxbs keeps the release's own cuda_graph_max_bs (256 on an 80 GiB card:
# engine_extra cuda_graph_max_bs null, not passed) and runs bs 264 above it, the proof on the
# release's defaults. The other steps also LOWER it to 8 and run bs 16 eager beside the captured
# bs 1 and 8 (a comparison, as in the first lease).
#
# Started once, in the background, by the first device call that carries the bundle (calls.md).
R=${R:-/tmp/pkrun}
B12=${B12:-/tmp/b12}
B10=${B10:-/tmp/b10}
FA3=${FA3:-/tmp/pk_fa3/flash_ops.abi3.so}
WAIT_S=${WAIT_S:-20}
GIVE_UP_S=${GIVE_UP_S:-3300}
# Order: what the device time (30 min for the session, counted whole) reaches first.
STEPS=${STEPS:-"s12-maxbs s12-triton s12-fa3 b12-triton"}
LOW='{"cuda_graph_max_bs": 8}'
mkdir -p "$R"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }

ready() {  # bundle [fa3-lib]: are this step's inputs there?
  [ -e "$1/manifest.json" ] && { [ -z "$2" ] || [ -e "$(dirname "$2")/fa3.json" ]; }
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

step() {  # name: run it when its inputs are there (return 2: not yet)
  [ -e "$R/$1/.done" ] && return 0
  local common=(--workloads uniform,penalized --runs 3 --run-timeout 560)
  local low=(--batch-sizes 1,8,16 --engine-extra "$LOW")
  case $1 in
    s12-triton) ready "$B12" || return 2
      orchestrate "$1" "$B12" 2700 --releases 0.5.12.post1 --sizes small --attention-backend triton \
        "${low[@]}" "${common[@]}" ;;
    s12-fa3) ready "$B12" "$FA3" || return 2
      orchestrate "$1" "$B12" 2700 --releases 0.5.12.post1 --sizes small --attention-backend default \
        --fa3-lib "$FA3" "${low[@]}" "${common[@]}" ;;
    b12-fa3) ready "$B12" "$FA3" || return 2
      orchestrate "$1" "$B12" 1500 --releases 0.5.12.post1 --sizes 8b --attention-backend default \
        --fa3-lib "$FA3" "${low[@]}" "${common[@]}" --runs 2 ;;
    s12-maxbs) ready "$B12" "$FA3" || return 2
      orchestrate "$1" "$B12" 1500 --releases 0.5.12.post1 --sizes small --attention-backend default \
        --fa3-lib "$FA3" --batch-sizes 264 --engine-extra '{"cuda_graph_max_bs": null}' \
        --workloads uniform,penalized --runs 2 --run-timeout 700 --label maxbs ;;
    s10-fa3) ready "$B10" "$FA3" || return 2
      orchestrate "$1" "$B10" 2700 --releases 0.5.10 --sizes small --attention-backend default \
        --fa3-lib "$FA3" "${low[@]}" "${common[@]}" --rounds 2 ;;
    b12-triton) ready "$B12" || return 2
      orchestrate "$1" "$B12" 1500 --releases 0.5.12.post1 --sizes 8b --attention-backend triton \
        "${low[@]}" "${common[@]}" ;;
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
