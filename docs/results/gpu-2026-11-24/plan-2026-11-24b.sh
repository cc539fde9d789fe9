#!/bin/bash
# Issue 23, second round of 2026-11-24: the sync's cost in one process again, with
# the runner reading each call's settled sync counts and with longer and more
# alternations (the first round's per-call step counts leaked across calls and its
# intervals were ±10-20 % for the small model). Same layout as plan-2026-11-24.sh.
R=/tmp/pkrun
mkdir -p $R
note() { echo "[$(date +%T)] $*" >> $R/progress.log; }

orchestrate() {  # step bundle timeout_s args...
  local name=$1 bundle=$2 tmo=$3; shift 3
  [ -e $R/$name/.done ] && return
  mkdir -p $R/$name; note "start $name"
  (cd $bundle && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout $tmo \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out $R/$name "$@" > $R/$name/console.log 2>&1)
  note "end $name rc=$?"; touch $R/$name/.done
}

B12=/tmp/b12
orchestrate cost-0.5.12.post1-small $B12 900 --sizes small --alternate 30 \
  --workloads uniform,mixed --batch-sizes 1,8,32,64 --max-new-tokens 256 --run-timeout 880
orchestrate cost-0.5.12.post1-8b $B12 700 --sizes 8b --alternate 20 --workloads uniform \
  --batch-sizes 1,8,32,64 --max-new-tokens 128 --run-timeout 680
orchestrate cost-standalone-0.5.12.post1-small $B12 400 --sizes small --scenario standalone \
  --alternate 30 --batch-sizes 8,32 --max-new-tokens 256 --run-timeout 380
orchestrate cost-0.5.12.post1-8b-mixed $B12 500 --sizes 8b --alternate 20 --workloads mixed \
  --batch-sizes 8,32 --max-new-tokens 128 --run-timeout 480
note "all done"
