#!/bin/bash
# GPU plan for issues 44 (FA3 tree drafts on spec v2), 42 (upstream's later fixes, A/B at
# the 8B shape) and 43 (a release before 0.5.10), planned 2026-11-26 (third session).
# Every engine runs the release's defaults (no --attention-backend: FA3 on Hopper, read
# back; piecewise CUDA graph as the release leaves it), checkpoint-shaped EAGLE3 drafts.
#
# Started once, in the background, by the first device call (calls.md beside this); it
# travels inside the first carried bundle. Later calls bring what later steps wait for
# and tar /tmp/pkrun into $OUT. Each step leaves .done; a step whose inputs are not there
# is put back and tried after the others.
#   t13-tree   0.5.13 small Llama (vocab 128256), topk 4 / 8 draft tokens (spec v2 takes
#              topk > 1 from 0.5.13), context 8192 (>= chunked prefill: the piecewise
#              warm-up fits), cuda_graph_max_bs 2, max_running_requests 16; bs 1, 2
#              (captured) and 16 (eager, above the captured size) with 1200-token prompts:
#              D*sum(seq_lens) + bs*D^2 = 162816 cells > the preallocated 2*8*(8192+8) =
#              131200, so the mask without issue 29's guard would be overrun. Pristine vs
#              patched.
#   ab12-8b    0.5.12.post1 8B Llama (vocab 128256, context 131072), bs 8, 32, 48 (all
#              captured: cuda_graph_max_bs 48), variants: patched (HEAD), mask-only
#              (patchkit at 867970b: the compact verify mask, page tables as before) and
#              before42 (patchkit at 1fc5ee5: neither), 2 rounds, the order flipped in
#              the second (ABC CBA).
#   p9         0.5.9 small Llama, pristine vs patched (its pins made to run: wheels.py).
#   p9-rounds  the same, 2 rounds, the order flipped in the second (2026-11-26, fourth
#              session; the run records which sgl_kernel stand-ins it met).
#   t13-memcheck  0.5.13 patched only, bs 16 eager, 16 new tokens, piecewise off (a
#              comparison setting: speed under the sanitizer), compute-sanitizer memcheck.
R=${R:-/tmp/pkrun}
B13=${B13:-/tmp/b13}
B12=${B12:-/tmp/b12}
B9=${B9:-/tmp/b9}
FA3=${FA3:-/tmp/pk_fa3/flash_ops.abi3.so}
FA3_13=${FA3_13:-/tmp/pk_fa3_043/flash_ops.abi3.so}
WAIT_S=${WAIT_S:-60}
GIVE_UP_S=${GIVE_UP_S:-3000}
STEPS=${STEPS:-"t13-tree ab12-8b p9 t13-memcheck"}
TREE='{"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8, "cuda_graph_max_bs": 2, "max_running_requests": 16}'
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
  note "end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1); $(grep -c '^PROBLEM' "$R/$name/console.log") problem lines)"
  touch "$R/$name/.done"
}

step() {  # name: run it when its inputs are there (return 2: not yet)
  [ -e "$R/$1/.done" ] && return 0
  local tree=(--sizes small --attention-backend default --context-length 8192 --engine-extra "$TREE")
  case $1 in
    t13-tree) ready "$B13" "$FA3_13" || return 2
      orchestrate "$1" "$B13" 1500 --releases 0.5.13 --fa3-lib "$FA3_13" "${tree[@]}" \
        --batch-sizes 1,2,16 --input-len 1200 --max-new-tokens 64 --runs 2 --run-timeout 700 ;;
    ab12-8b) ready "$B12" "$FA3" || return 2
      orchestrate "$1" "$B12" 2400 --releases 0.5.12.post1 --fa3-lib "$FA3" --sizes 8b \
        --attention-backend default --variants patched,mask-only,before42 --compare before42,patched \
        --rounds 2 --batch-sizes 8,32,48 --runs 3 --max-new-tokens 256 --run-timeout 520 ;;
    p9) ready "$B9" "$FA3" || return 2
      orchestrate "$1" "$B9" 1100 --releases 0.5.9 --fa3-lib "$FA3" --sizes small \
        --attention-backend default --batch-sizes 1,8 --runs 3 --run-timeout 520 ;;
    p9-rounds) ready "$B9" "$FA3" || return 2  # fourth session: run 3's settings, 2 rounds (AB BA)
      orchestrate "$1" "$B9" 1500 --releases 0.5.9 --fa3-lib "$FA3" --sizes small \
        --attention-backend default --batch-sizes 1,8 --runs 3 --rounds 2 --run-timeout 520 ;;
    t13-memcheck) ready "$B13" "$FA3_13" || return 2
      local cs; cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      [ -n "$cs" ] || { note "no compute-sanitizer on this image"; mkdir -p "$R/$1"; touch "$R/$1/.done"; return 0; }
      mkdir -p "$R/$1"
      CUDA_LAUNCH_BLOCKING=1 orchestrate "$1" "$B13" 600 --releases 0.5.13 --fa3-lib "$FA3_13" "${tree[@]}" \
        --variants patched --piecewise off --batch-sizes 16 --input-len 1200 --max-new-tokens 16 --runs 1 \
        --run-timeout 560 --wrap "$cs --tool memcheck --target-processes all --print-limit 50 --log-file $R/$1/memcheck.%p.log" ;;
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
