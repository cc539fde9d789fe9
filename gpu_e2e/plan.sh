#!/bin/bash
# The GPU plan (from issue 67's speed grid, first run 2026-11-28): steps of orchestrator calls
# over one machine's GPUs, one lane per GPU (CUDA_VISIBLE_DEVICES=<lane>), the lanes in
# parallel, each with its own --work, port, FlashInfer / Triton / inductor caches. A run is
# this script plus its arguments (the variables below), recorded beside its results as
# plan-args.json ({"plan": "gpu_e2e/plan.sh", "env": {...}}; docs/results/README.md):
#   LANES="0 1" STEPS="triton-r1 fa3-r1" WITH17="fa3-r1" GIVE_UP_S=900 bash gpu_e2e/plan.sh
#
# Every engine: counters off (PK_E2E_COUNTERS_OFF=1), release defaults otherwise (piecewise
# CUDA graph as the release leaves it; FA3 steps name no backend, so Hopper picks FA3, read back
# in settings.md; Triton steps name triton), checkpoint-shaped EAGLE3 draft, the models' own
# context (131072), uniform workload, greedy, ignore_eos, 128 new tokens, 2 timed generates per
# batch size (plus the harness's one-token runs for the decode-only rate),
#   engine-extra {"cuda_graph_max_bs": 32, "max_running_requests": 128, "port": <per lane>}:
#   bs 1, 8, 32 replay captured graphs; bs 64 and 128 run EAGER (above cuda_graph_max_bs;
#   0.5.17 takes it as cuda_graph_max_bs_decode, server_args_names.py).
#
# A step is one round of one cell on one GPU: 0.5.12.post1 pristine + patched (bundle B12, one
# orchestrator call, order flipped every round) and upstream 0.5.17 (bundle B17), ABBA:
#   r1: B12 (pristine, patched), B17     r2: B17, B12 (patched, pristine)     r3: as r1
# Cells (backend_shape-round): triton / fa3 (small) r1-r3 and triton_8b / fa3_8b r1 r2 with the
#   three variants; the 8B r3 pristine + patched only.
# Env steps (patched 0.5.12.post1 alone, small shape): triton_check-r1, fa3_check-r1 with
#   PATCHKIT_CHECK_SEQ_LEN_BOUND=1 (the bound checked against the device value every step, a raise
#   fails the run; timing not comparable); fa3_static-r1 with PATCHKIT_SEQ_LEN_BOUND=static.
# Duel steps (2026-11-28c on; duel.py): fa3_duel, triton_duel, fa3_8b_duel, triton_8b_duel,
#   flashinfer_duel: every tree's engine alive at once on the lane's GPU (pristine, patched, at the
#   small shape a second patched engine as the noise control, 0.5.17 where WITH17 allows and it
#   fits), then ROUNDS rounds of one generate per engine per batch size, the order reversed every
#   round, the engines not being timed frozen. Engine-extra adds max_total_tokens (the engines
#   share the GPU's memory: 200000 small, 60000 8B). DS_DUEL=1 adds DeepSeek at TP 4 + DP 4 last.
#   2026-11-28d on: B12M (a bundle without fa3-spec-v2) beside the FA3 cells; the FlashInfer
#   cells add the patched tree with PATCHKIT_FLASHINFER_HOST_INDPTR=1 (issue 71; no control there), and
#   flashinfer_ds_duel is DeepSeek MTP on one GPU with FlashInfer MLA; COUNT="STEP ..." adds
#   counted engines (round 1 only); DUEL_DEADLINE_S: no round of a duel starts after it.
#   dsa_duel (issue 72): DeepSeek-V3.2 MTP on one GPU from BDSA (a bundle built with
#   --kernel flashmla --wheel sgl-deep-gemm), pristine against patched; DS_SIZE=dsv32 makes
#   the DS_DUEL step DeepSeek-V3.2 at TP 4 + DP 4 from the same bundle.
# Each scheduler's value of these variables is read back (engine_env.py): a wrong one is a PROBLEM.
#
# Scheduling: the lanes take steps from one list in its order (a step is claimed by mkdir), the
# first whose inputs are there: longest first (8B), Triton before FA3 (FA3's libraries come in
# later calls), the check steps early, the short env step last. The first grid's estimate (small
# engine ~85 s, 8B ~126 s: ~17-18 minutes over 4 lanes) ran ~2.5x short.
#
# Inputs ($B12 $B17 bundles, FA3 libraries unpacked to $FA3_12 $FA3_17 with fa3.json beside):
# docs/results/gpu-grid-2026-11-28/calls.md shows the calls that bring them. Each step leaves
# .done; progress.log says which GPU ran what.
# Poll with gpu_e2e/poll.sh (SLEEP=240 bash gpu_e2e/poll.sh): each call then brings every step's JSON back
# in $OUT, so a machine lost between calls loses no result (2026-11-28c lost a grid that way).
R=${R:-/tmp/pkrun}
B12=${B12:-/tmp/b12}
B17=${B17:-/tmp/b17}
FA3_12=${FA3_12:-/tmp/pk_fa3/flash_ops.abi3.so}
FA3_17=${FA3_17:-/tmp/pk_fa3_17/flash_ops.abi3.so}
LANES=${LANES:-"0 1 2 3"}
GIVE_UP_S=${GIVE_UP_S:-1500}
# QUIET (2026-11-28f on): the steps run with every other lane idle (run_alone_or_shared). Later
# runs set these (plan-args.json says which): NEW_TOKENS and RUNS per timed generate; PIN=1 pins
# each lane to its share of the cores (taskset); DEADLINE_S: no step starts after it (seconds
# since the plan began), so a lease ends with whole steps.
NEW_TOKENS=${NEW_TOKENS:-128}
ROUNDS=${ROUNDS:-8}  # a duel step's rounds (duel.py: every engine at every batch size, the order reversed each round)
RUNS=${RUNS:-2}
REPEATS=${REPEATS:-1}  # a duel's generates per engine, batch size and round, back to back (their median; duel.py --repeats)
PIN=${PIN:-0}
DEADLINE_S=${DEADLINE_S:-0}
# PROF_BS: the eager batch a *_prof step profiles; PIN_LANES: the lanes PIN divides the cores by,
# where several plan.sh run side by side; PROF17=1: a *_prof step profiles 0.5.17 too (prof_upstream)
PROF_BS=${PROF_BS:-128}
STEPS=${STEPS:-"triton_check-r1 triton_8b-r1 triton_8b-r2 fa3_8b-r1 fa3_8b-r2 triton_8b-r3 fa3_8b-r3 fa3_check-r1
  triton-r1 fa3-r1 triton-r2 fa3-r2 triton-r3 fa3-r3 fa3_static-r1"}
export PK_E2E_COUNTERS_OFF=1
mkdir -p "$R/claims"
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }

ready() {  # bundle [fa3-lib]: its inputs are there (a joined bundle appears only once whole)
  [ -e "$1/manifest.json" ] && { [ -z "$2" ] || [ -e "$(dirname "$2")/fa3.json" ]; }
}

pin_of() {  # lane: the taskset prefix of that lane's share of the host's cores (PIN=1), else nothing
  # whole physical cores a lane (cpu_lanes.py, 2026-11-28f: lanes of logical CPUs 0-15 and 16-31
  # shared every core's two hyperthreads, and a busy lane slowed the other's engines 1.55x)
  if [ "$PIN" = 1 ] && command -v taskset > /dev/null; then
    local n_lanes cpus; n_lanes=$(echo ${PIN_LANES:-$LANES} | wc -w)
    cpus=$(cd "$B12" && PYTHONPATH=e2e python3 -m pk_gpu_e2e.cpu_lanes "${1%%,*}" "$n_lanes" 2>/dev/null) \
      || { local share=$(( $(nproc) / n_lanes )); cpus="$((${1%%,*} * share))-$((${1%%,*} * share + share - 1))"; }
    echo taskset -c "$cpus"
  fi
}

orchestrate() {  # lane name bundle timeout_s args... (WORK: another --work than the lane's)
  local lane=$1 name=$2 bundle=$3 tmo=$4; shift 4
  mkdir -p "$R/$name"; note "gpu $lane: start $name"
  local pin; read -ra pin <<< "$(pin_of "$lane")"
  (cd "$bundle" && CUDA_VISIBLE_DEVICES=$lane FLASHINFER_WORKSPACE_BASE=/tmp/fi$lane \
     TRITON_CACHE_DIR=/tmp/triton$lane TORCHINDUCTOR_CACHE_DIR=/tmp/inductor$lane \
     PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "$tmo" \
     "${pin[@]}" python3 -m pk_gpu_e2e.orchestrate --bundle . --out "$R/$name" --work "${WORK:-/tmp/pkw$lane}" "$@" \
     > "$R/$name/console.log" 2>&1)
  local rc=$?
  echo "$lane" > "$R/$name/gpu"
  note "gpu $lane: end $name rc=$rc ($(grep -h '^verdict' "$R/$name/console.log" | tail -1); $(grep -c '^PROBLEM' "$R/$name/console.log") problem lines)"
}

duel_step() {  # lane step shape: the trees' engines alive side by side on this GPU (duel.py)
  local lane=$1 step=$2 shape=$3 cell=${2%-r*} b=$B12
  [[ $cell == dsa* ]] && b=${BDSA:-$B12}  # DeepSeek-V3.2: the bundle with deep_gemm and FlashMLA
  local eng=(--engine "pristine=$b:0.5.12.post1:pristine" --engine "patched=$b:0.5.12.post1:patched")
  local pairs="pristine:patched,upstream:patched,patched:patched-again" once=()
  local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "$lane" 2>/dev/null || echo 0)
  local tokens=200000 be=triton fa=() scen=(--size "$shape") bss=1,8,32,64,128 cap=32
  [ "$shape" = 8b ] && tokens=60000
  # the control (a second patched engine) at the small shape; 0.5.17 beside where asked and it fits
  # (8B: three engines need more than an 80 GB card)
  local again=0
  [ "$shape" = small ] && [[ $cell != flashinfer* && $cell != dsa* ]] && again=1
  # AGAIN=1: the control at 8B too where the card holds four engines, and at FlashInfer (after 29e)
  [ "${AGAIN:-0}" = 1 ] && [[ $cell != dsa* ]] && { [ "$shape" = small ] || [ "${mib:-0}" -gt 120000 ]; } && again=1
  [ $again = 1 ] && eng+=(--engine "patched-again=$B12:0.5.12.post1:patched")
  # PRISTINE_AGAIN=1 (after 2026-11-29e, where one patched engine sat 4% from the other a whole
  # duel): pristine twice too, the trees read from a second pair of engines
  if [ $again = 1 ] && [ "${PRISTINE_AGAIN:-0}" = 1 ]; then
    eng+=(--engine "pristine-again=$B12:0.5.12.post1:pristine")
    pairs+=",pristine:pristine-again,pristine-again:patched-again"
  fi
  if with17 "$step" && [[ $cell != dsa* ]] && { [ "$shape" != 8b ] || [ "${mib:-0}" -gt 100000 ]; }; then
    eng+=(--engine "upstream=$B17:0.5.17:upstream")
  fi
  [[ $cell == fa3* ]] && { be=default; fa=(--fa3-lib "$B12:$FA3_12" --fa3-lib "$B17:$FA3_17"); }
  # SCENARIO (after 2026-11-29d): another spec scenario, e.g. standalone (the draft is the target)
  [ -n "${SCENARIO:-}" ] && scen+=(--scenario "$SCENARIO")
  # issue 72: DeepSeek-V3.2 (sparse attention: sglang picks its NSA backend, FA3 decode on Hopper)
  [[ $cell == dsa* ]] && { be=default; fa=(--fa3-lib "$b:$FA3_12"); scen=(--size dsv32 --scenario mtp); bss=1,8,32,64; cap=8; tokens=100000; }
  # B12M (2026-11-28d): a bundle whose patched tree leaves fa3-spec-v2 out, beside the FA3 cells
  if [[ $cell == fa3* ]] && [ -n "${B12M:-}" ]; then
    eng+=(--engine "minus-fa3-spec-v2=$B12M:0.5.12.post1:minus-fa3-spec-v2"); fa+=(--fa3-lib "$B12M:$FA3_12")
    pairs+=",pristine:minus-fa3-spec-v2,patched:minus-fa3-spec-v2"
  fi
  local counted="pristine patched"
  if [[ $cell == flashinfer* ]]; then  # issue 71: the host plans' switch off (patched) and on
    be=flashinfer
    local graph="patched-graph=$B12:0.5.12.post1:patched:PATCHKIT_FLASHINFER_HOST_INDPTR=1,PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1"
    if [ "${FI_GRAPH:-0}" = only ]; then
      # FI_GRAPH=only (2026-11-28e): both switches on against pristine and 0.5.17 alone (the
      # switches off and the host plans alone were timed in 2026-11-28d); counted: that tree
      eng=("${eng[@]/#patched=*/$graph}"); counted=patched-graph  # in the patched engine's place
      pairs="pristine:patched-graph,upstream:patched-graph"
    else
      eng+=(--engine "patched-hostplan=$B12:0.5.12.post1:patched:PATCHKIT_FLASHINFER_HOST_INDPTR=1")
      pairs+=",pristine:patched-hostplan,upstream:patched-hostplan,patched:patched-hostplan"
    fi
    # FI_GRAPH=1: the draft extend in a CUDA graph too (flashinfer-draft-extend-graph, after 2026-11-28d)
    if [ "${FI_GRAPH:-0}" = 1 ]; then
      eng+=(--engine "$graph")
      pairs+=",pristine:patched-graph,upstream:patched-graph,patched-hostplan:patched-graph"
    fi
  fi
  if [[ $cell == *_ds_* ]]; then  # DeepSeek MTP on one GPU (FlashInfer MLA at flashinfer_ds)
    scen=(--size ds --scenario mtp); bss=1,8,32,64; cap=8; tokens=100000
  fi
  # COUNT (the steps named): one more engine per tree with the counters on, timed in round 1
  # only and compared with nothing: their host waits per decode step, site by site
  if [[ " ${COUNT:-} " == *" $step "* ]]; then
    for e in $counted; do
      if [ "$e" = patched-graph ]; then
        eng+=(--engine "$e-count=${graph#*=},PK_E2E_COUNTERS_OFF=")
      else
        eng+=(--engine "$e-count=$b:0.5.12.post1:$e:PK_E2E_COUNTERS_OFF=")
      fi
      once+=(--once "$e-count")
    done
    [[ $cell == flashinfer* && ${FI_GRAPH:-0} != only ]] && { eng+=(--engine "patched-hostplan-count=$B12:0.5.12.post1:patched:PK_E2E_COUNTERS_OFF=,PATCHKIT_FLASHINFER_HOST_INDPTR=1"); once+=(--once patched-hostplan-count); }
  fi
  # BLOCKING (the steps named, 2026-11-28e): one more pristine engine with CUDA_LAUNCH_BLOCKING=1,
  # in round 1 only: where a kernel fault happens (28e's DSA pristine faulted at its first generate)
  if [[ " ${BLOCKING:-} " == *" $step "* ]]; then
    eng+=(--engine "pristine-blocking=$b:0.5.12.post1:pristine:CUDA_LAUNCH_BLOCKING=1"); once+=(--once pristine-blocking)
  fi
  # GC_LOG (the steps named): one more engine per tree with sglang's SGLANG_LOG_GC=1, timed every
  # round and compared with nothing: each call's garbage collections (decode_log.py)
  if [[ " ${GC_LOG:-} " == *" $step "* ]]; then
    for e in pristine patched; do eng+=(--engine "$e-gc=$b:0.5.12.post1:$e:SGLANG_LOG_GC=1"); done
  fi
  # BATCH_SIZES (after 2026-11-28i): the duels' batch sizes, in place of the cell's own, e.g. one
  # eager cell over many short rounds (an engine alone moved 1.16-1.59x from round to round there:
  # a median that holds needs rounds by the hundred, not three)
  bss=${BATCH_SIZES:-$bss}
  local extra="{\"cuda_graph_max_bs\": $cap, \"max_running_requests\": 128, \"max_total_tokens\": $tokens}"
  duel "$lane" "$step" "${eng[@]}" "${once[@]}" "${fa[@]}" "${scen[@]}" --attention-backend "$be" \
    --batch-sizes "$bss" --rounds "$ROUNDS" --repeats "$REPEATS" --max-new-tokens "$NEW_TOKENS" --engine-extra "$extra" \
    --compare "$pairs" --deadline-s "${DUEL_DEADLINE_S:-0}" --min-rounds "${MIN_ROUNDS:-0}" --base-port $((31000 + 2000 * lane))
}

duel() {  # gpus name args...: one duel.py call (the driver and every engine on GPUs "gpus")
  local gpus=$1 name=$2; shift 2
  # PY_SPY (after 2026-11-29): py-spy's program; each timed call's Python is sampled (py_stacks.py),
  # in the first PY_SPY_ROUNDS rounds only where that is set
  local opts=(); [ -n "${PY_SPY:-}" ] && opts=(--py-spy "$PY_SPY" --py-spy-rounds "${PY_SPY_ROUNDS:-0}")
  # DUEL_CPUS (after 2026-11-29): a CPU list every engine's threads are held to once up, the same
  # for every tree (e.g. "$(python3 -m pk_gpu_e2e.cpu_lanes 1 4)": two whole cores past core 0)
  [ -n "${DUEL_CPUS:-}" ] && opts+=(--cpus "$DUEL_CPUS")
  # ROTATE=1: each engine in each place of a round in turn; TARGET_WEIGHTS=random: target_weights.py
  [ "${ROTATE:-0}" = 1 ] && opts+=(--rotate)
  mkdir -p "$R/$name"; note "gpu $gpus: start $name"
  # PIN=1: a one-lane duel's driver and engines (they inherit it) stay on the lane's cores
  local pin=(); [[ $gpus != *,* ]] && read -ra pin <<< "$(pin_of "$gpus")"
  (cd "$B12" && CUDA_VISIBLE_DEVICES=$gpus FLASHINFER_WORKSPACE_BASE=/tmp/fi${gpus//,/} PK_E2E_TARGET_WEIGHTS=${TARGET_WEIGHTS:-} \
     TRITON_CACHE_DIR=/tmp/triton${gpus//,/} TORCHINDUCTOR_CACHE_DIR=/tmp/inductor${gpus//,/} \
     PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout "${DUEL_TIMEOUT_S:-1500}" "${pin[@]}" python3 -m pk_gpu_e2e.duel --out "$R/$name" \
     --work "/tmp/pkd${gpus//,/}" "${opts[@]}" "$@" > "$R/$name/console.log" 2>&1)
  note "gpu $gpus: end $name rc=$? ($(grep -c ' round .* done' "$R/$name/console.log") rounds)"
}

with17() {  # step: does it time 0.5.17 too? (WITH17: the steps that do; default all but 8B r3)
  if [ -n "${WITH17:-}" ]; then [[ " $WITH17 " == *" $1 "* ]]; return; fi
  [[ $1 != *_8b-r3 ]]
}

inputs_ready() {  # step
  local cell=${1%-r*}
  case $cell in
    *_check|*_static|*_count|*_prof) [[ $cell == fa3* ]] && { ready "$B12" "$FA3_12"; return; }; ready "$B12"; return ;;
  esac
  if [[ $cell == fa3*_duel ]] && [ -n "${B12M:-}" ] && ! ready "$B12M"; then return 1; fi
  if [[ $cell == dsa* ]]; then ready "${BDSA:-$B12}" "$FA3_12"; return; fi
  if [[ $cell == fa3* ]]; then ready "$B12" "$FA3_12" && { ! with17 "$1" || ready "$B17" "$FA3_17"; }
  else ready "$B12" && { ! with17 "$1" || ready "$B17"; }; fi
}

run_step() {  # lane step
  local lane=$1 step=$2 cell=${2%-r*} rnd=${2##*-}
  local extra="{\"cuda_graph_max_bs\": 32, \"max_running_requests\": 128, \"port\": $((31000 + 2000 * lane))}"
  local shape=small tmo=700 rto=330
  [[ $cell == *_8b* ]] && { shape=8b; tmo=900; rto=420; }
  # FlashInfer without an earlier machine's compiled kernels (CACHES) JIT-builds them in its first
  # engine's start and first batches: 2026-11-29's profile lost its pristine engine at 330 s that way
  [[ $cell == flashinfer* ]] && [ -z "${PK_E2E_EXTRA_SITE:-}" ] && rto=$((rto > 600 ? rto : 600))
  local a=(--sizes "$shape" --batch-sizes 1,8,32,64,128 --max-new-tokens "$NEW_TOKENS" --runs "$RUNS" --run-timeout "$rto"
           --engine-extra "$extra" --label "$rnd")
  local a12=("${a[@]}") a17=("${a[@]}")
  if [[ $cell == fa3* ]]; then
    a12+=(--attention-backend default --fa3-lib "$FA3_12"); a17+=(--attention-backend default --fa3-lib "$FA3_17")
  elif [[ $cell == flashinfer* ]]; then  # after 2026-11-28i: FlashInfer's eager bs 128 profiled
    a12+=(--attention-backend flashinfer); a17+=(--attention-backend flashinfer)
  else
    a12+=(--attention-backend triton); a17+=(--attention-backend triton)
  fi
  case $cell in
    *_duel) duel_step "$lane" "$step" "$shape"; return ;;
    *_check)  orchestrate "$lane" "$step-b12" "$B12" 400 --releases 0.5.12.post1 --variants patched "${a12[@]}" \
                --engine-env PATCHKIT_CHECK_SEQ_LEN_BOUND=1; return ;;
    *_static) orchestrate "$lane" "$step-b12" "$B12" 400 --releases 0.5.12.post1 --variants patched "${a12[@]}" \
                --engine-env PATCHKIT_SEQ_LEN_BOUND=static; return ;;
    # host waits by torch's count: the patched engine alone with the counters on (timing not compared)
    *_count) PK_E2E_COUNTERS_OFF= orchestrate "$lane" "$step-b12" "$B12" "$tmo" --releases 0.5.12.post1 \
                --variants patched "${a12[@]}"; return ;;
    # one eager batch of each tree under sglang's profiler, then both traces side by side (the
    # runner writes the traces beside its results, under the lane's --work: 2026-11-28b read
    # the step folder and found none)
    # r2 profiles the pair in the other order (2026-11-28e: in both profiled pairs so far the
    # patched engine ran second and its host ran slower in every op alike)
    # FlashInfer r3 (after 2026-11-28i): the pair with both FlashInfer switches on (pristine has
    # no patchkit runtime: the variables change nothing there)
    *_prof) local pv=pristine,patched fienv=(); [ "$rnd" = r2 ] && pv=patched,pristine
            [[ $cell == flashinfer* && $rnd == r3 ]] && fienv=(--engine-env PATCHKIT_FLASHINFER_HOST_INDPTR=1
                --engine-env PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1)
            orchestrate "$lane" "$step-b12" "$B12" $((tmo * 2)) --releases 0.5.12.post1 --variants "$pv" \
                "${a12[@]/1,8,32,64,128/$PROF_BS}" --profile-batch "$PROF_BS" "${fienv[@]}"
            (cd "$B12" && PYTHONPATH=e2e python3 -m pk_gpu_e2e.profile_compare "/tmp/pkw$lane/results" \
                --out "$R/$step-b12/compare.json" --md "$R/$step-b12/compare.md" > "$R/$step-b12/compare.log" 2>&1)
            [ "${PROF17:-0}" = 1 ] && prof_upstream "$lane" "$step" "$tmo" "${a17[@]/1,8,32,64,128/$PROF_BS}"
            return ;;
  esac
  local v=pristine,patched; [ "$rnd" = r2 ] && v=patched,pristine
  local with17=1; with17 "$step" || with17=0
  if [ "$rnd" = r2 ]; then
    [ $with17 = 1 ] && orchestrate "$lane" "$step-b17" "$B17" "$tmo" --releases 0.5.17 "${a17[@]}"
    orchestrate "$lane" "$step-b12" "$B12" $((tmo * 2)) --releases 0.5.12.post1 --variants "$v" "${a12[@]}"
  else
    orchestrate "$lane" "$step-b12" "$B12" $((tmo * 2)) --releases 0.5.12.post1 --variants "$v" "${a12[@]}"
    [ $with17 = 1 ] && orchestrate "$lane" "$step-b17" "$B17" "$tmo" --releases 0.5.17 "${a17[@]}"
  fi
}

prof_upstream() {  # lane step timeout_s args...: PROF17=1, 0.5.17 profiled the same way after the
  # pair, then compared with the patched run (2026-11-28i: 0.5.17's gathers 292 us a step, patched's 74).
  # profile_compare pairs runs by their key, which names the release: 0.5.17's run is linked
  # into a folder of its own under 0.5.12.post1's key, beside the patched run's files.
  local lane=$1 step=$2 tmo=$3; shift 3
  WORK=/tmp/pkw${lane}u orchestrate "$lane" "$step-b17" "$B17" "$tmo" --releases 0.5.17 "$@" --profile-batch "$PROF_BS"
  local both=$R/$step-b17/runs; rm -rf "$both"; mkdir -p "$both"
  for f in /tmp/pkw"$lane"/results/0.5.12.post1_*_patched.json*; do ln -s "$f" "$both/"; done
  for f in /tmp/pkw"$lane"u/results/0.5.17_*_upstream.json*; do ln -s "$f" "$both/0.5.12.post1_${f##*/0.5.17_}"; done
  (cd "$B12" && PYTHONPATH=e2e python3 -m pk_gpu_e2e.profile_compare "$both" --base upstream --other patched \
     --out "$R/$step-b17/compare.json" --md "$R/$step-b17/compare.md" > "$R/$step-b17/compare.log" 2>&1)
}

run_alone_or_shared() {  # lane step: a QUIET step runs with no other step running, on any lane
  # (2026-11-28f: a busy neighbour lane slowed a launch-bound engine 1.55x a step). Every step
  # holds $R/quiet.lock shared, a QUIET one exclusive; while one waits ($R/quiet.wait.STEP) no
  # lane starts another step, so it cannot starve. Without flock: run as before, and say so.
  local lane=$1 step=$2
  if ! command -v flock > /dev/null; then
    [[ " ${QUIET:-} " == *" $step "* ]] && note "gpu $lane: no flock, $step runs beside the other lanes"
    run_step "$lane" "$step"; return
  fi
  if [[ " ${QUIET:-} " == *" $step "* ]]; then
    touch "$R/quiet.wait.$step"; note "gpu $lane: $step waits for the other lanes (QUIET)"
    ( flock -x 9; rm -f "$R/quiet.wait.$step"; note "gpu $lane: $step runs alone"; run_step "$lane" "$step" ) 9> "$R/quiet.lock"
  else
    while compgen -G "$R/quiet.wait.*" > /dev/null; do sleep 2; done
    ( flock -s 9; run_step "$lane" "$step" ) 9> "$R/quiet.lock"
  fi
}

lane() {  # gpu: take the first unclaimed step whose inputs are there, until none is left
  local gpu=$1
  while :; do
    local left=0 ran=""
    for s in $STEPS; do
      [ -e "$R/claims/$s" ] && continue
      left=1
      inputs_ready "$s" || continue
      [ "$DEADLINE_S" -gt 0 ] && [ $SECONDS -ge "$DEADLINE_S" ] && { note "gpu $gpu: deadline, $s not started"; return; }
      mkdir "$R/claims/$s" 2>/dev/null || continue  # another lane took it
      run_alone_or_shared "$gpu" "$s"; touch "$R/claims/$s/.done"; ran=$s; break
    done
    [ $left = 0 ] && { note "gpu $gpu: no step left"; return; }
    [ -z "$ran" ] && { [ $SECONDS -ge "$GIVE_UP_S" ] && { note "gpu $gpu: gave up waiting for inputs"; return; }; sleep 10; }
  done
}

note "plan: $(echo $STEPS) on GPUs $LANES"
# CACHES (after 2026-11-28h): a tar.gz of an earlier machine's compiled kernels
# (gpu_e2e/compile_caches.py), put into every lane's cache folders (and the DeepSeek duel's)
# before the first engine, its FlashInfer modules on the runners' path; HARVEST=1: the caches
# this machine built packed at the end and cut into parts of 15 MiB (/tmp/caches-a, -b, ...), which
# poll.sh brings back, four at a time, once packed (CACHES_BACK=0 leaves them; 64 MiB a call).
CACHE_ROOT=${CACHE_ROOT:-/tmp}  # where the lanes' cache folders are (a test's own folder in tests)
cache_dirs() {  # kind: each lane's folder of that kind (/tmp/<kind><lane>), the DeepSeek duel's too
  for g in $LANES $(seq -s "" 0 $((${DS_TP:-4} - 1))); do echo "--$1 $CACHE_ROOT/$1$g"; done
}
if [ -n "${CACHES:-}" ] && [ -f "$CACHES" ]; then
  # shellcheck disable=SC2046
  (cd "$B12" && python3 e2e/pk_gpu_e2e/compile_caches.py install --src "$CACHES" $(cache_dirs triton) \
     $(cache_dirs inductor) --flashinfer-site "$CACHE_ROOT/pk_fi_aot") >> "$R/progress.log" 2>&1 \
    && export PK_E2E_EXTRA_SITE=$CACHE_ROOT/pk_fi_aot
  note "caches: $CACHES installed (rc $?)"
fi
[ "$PIN" = 1 ] && note "host: $(cd "$B12" && PYTHONPATH=e2e python3 -m pk_gpu_e2e.cpu_lanes --describe 2>/dev/null || nproc); lanes pinned: $(for g in $LANES; do echo -n "$g:$(pin_of "$g" | cut -d' ' -f3) "; done)"
# DS_DUEL=1: DeepSeek MTP at TP 4 + DP attention 4 on GPUs 0-3, pristine against patched in one
# duel (FA3; cuda_graph_max_bs 8: bs 1 and 8 captured, 48 and 128 eager), engines started one after
# another, after the lanes' steps; DS_FIRST=1 (2026-11-28h): before them, once B12 and FA3's library
# are there (the later calls' transfers then overlap it). DS_TP=2: TP 2 + DP attention 2 on GPUs 0-1
# (issue 67's cell where no four-GPU kind is lent). DS_DEADLINE_S: not started after that many
# seconds since the plan began (0: no limit); DS_ROUNDS_DEADLINE_S: no round after that many
# seconds since the duel began (its engines start inside it), except its first DS_MIN_ROUNDS
# (MIN_ROUNDS: the same for the lanes' duels, past DUEL_DEADLINE_S); DS_TIMEOUT_S: the whole duel's limit;
# DS_BATCH_SIZES: default 1,8,48,128.
ds_duel() {
  DS_DEADLINE_S=${DS_DEADLINE_S:-0}
  if [ "$DS_DEADLINE_S" -gt 0 ] && [ $SECONDS -ge "$DS_DEADLINE_S" ]; then
    note "ds_dp_duel-r1 not started: past DS_DEADLINE_S ($DS_DEADLINE_S s)"; return
  fi
  # DS_SIZE=dsv32: DeepSeek-V3.2 (issue 72) from BDSA, the bundle with deep_gemm and FlashMLA
  DS_SIZE=${DS_SIZE:-ds}; DSB=$B12; [ "$DS_SIZE" = dsv32 ] && DSB=${BDSA:-$B12}
  # DS_WITH17=1: upstream 0.5.17 a third engine (issue 67: an eager cell at >= 1.0x 0.5.17 too),
  # each engine then on less of the GPUs' memory; the duel waits for 0.5.17's bundle and FA3
  local up=() mem=0.4
  [ "${DS_WITH17:-0}" = 1 ] && { up=(--engine "upstream=$B17:0.5.17:upstream" --fa3-lib "$B17:$FA3_17"); mem=0.27; }
  until ready "$DSB" "$FA3_12" && { [ ${#up[@]} = 0 ] || ready "$B17" "$FA3_17"; }; do
    [ $SECONDS -ge "$GIVE_UP_S" ] && { note "ds_dp_duel-r1: gave up waiting for inputs"; return; }; sleep 5
  done
  DS_TP=${DS_TP:-4}; DS_GPUS=$(seq -s, 0 $((DS_TP - 1))); DS_NAME=${DS_SIZE}_dp; [ "$DS_TP" = 4 ] || DS_NAME+=$DS_TP
  DUEL_TIMEOUT_S=${DS_TIMEOUT_S:-1500} duel "$DS_GPUS" "${DS_NAME}_duel-r1" --engine "pristine=$DSB:0.5.12.post1:pristine" \
    --engine "patched=$DSB:0.5.12.post1:patched" --fa3-lib "$DSB:$FA3_12" "${up[@]}" --size "$DS_SIZE" --scenario mtp \
    --tp "$DS_TP" --dp "$DS_TP" --dp-attention --attention-backend default --batch-sizes "${DS_BATCH_SIZES:-1,8,48,128}" --rounds "$ROUNDS" --repeats "$REPEATS" \
    --max-new-tokens "$NEW_TOKENS" --mem-fraction-static "$mem" --deadline-s "${DS_ROUNDS_DEADLINE_S:-0}" \
    --min-rounds "${DS_MIN_ROUNDS:-0}" \
    --engine-extra '{"cuda_graph_max_bs": 8, "max_running_requests": 128, "max_total_tokens": 200000}'
}
[ "${DS_DUEL:-0}" = 1 ] && [ "${DS_FIRST:-0}" = 1 ] && ds_duel
# DS_ONLY=1: the DeepSeek duel alone (an empty LANES or STEPS means their defaults: 2026-11-28h's
# second plan set both empty and would have run the default grid after its duel)
if [ "${DS_ONLY:-0}" != 1 ]; then
  for g in $LANES; do lane "$g" & done
  wait
fi
[ "${DS_DUEL:-0}" = 1 ] && [ "${DS_FIRST:-0}" != 1 ] && ds_duel
if [ "${HARVEST:-0}" = 1 ]; then
  fis=(); for d in "$CACHE_ROOT"/fi*; do [ -d "$d" ] && fis+=(--fi "$d"); done
  # shellcheck disable=SC2046
  (cd "$B12" && mkdir -p "$CACHE_ROOT/caches" && python3 e2e/pk_gpu_e2e/compile_caches.py pack "${fis[@]}" \
     $(cache_dirs triton) $(cache_dirs inductor) --out "$CACHE_ROOT/caches/caches.tar.gz" \
     && python3 e2e/pk_gpu_e2e/bundle_parts.py split --folder "$CACHE_ROOT/caches" --part-mib 15) >> "$R/progress.log" 2>&1
  note "caches packed (rc $?): $(ls -d "$CACHE_ROOT"/caches-* 2>/dev/null | wc -l) part(s) in $CACHE_ROOT/caches-*"
fi
note "all done"
