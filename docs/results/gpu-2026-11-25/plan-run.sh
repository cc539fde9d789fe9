#!/bin/bash
# Issue 35's GPU runs (2026-11-25), as run: the earlier stop's plan with
# step 1 split so that the budget fits: 2 ABBA rounds first, then step 2, then a third
# round (order A B, as round 3 of an ABBA... schedule would be) if time remains.
R=/tmp/pkrun
mkdir -p $R
note() { echo "[$(date +%T)] $*" >> $R/progress.log; }
for _ in $(seq 120); do [ -e /tmp/pk_fa3/fa3.json ] && break; sleep 5; done
orchestrate() {  # step timeout_s args...
  local name=$1 tmo=$2; shift 2
  [ -e $R/$name/.done ] && return
  mkdir -p $R/$name; note "start $name"
  (cd /tmp/b12 && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout $tmo \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out $R/$name --sizes small --scenario standalone \
       --fa3-lib /tmp/pk_fa3/flash_ops.abi3.so "$@" > $R/$name/console.log 2>&1)
  note "end $name rc=$?"; touch $R/$name/.done
}
# 1. FA3 side by side with Triton, both patched (all ten patches): rounds 1-2 (A B, B A).
orchestrate fa3-vs-triton 1200 --variants patched@triton,patched@fa3 --compare patched@triton,patched@fa3 \
  --rounds 2 --batch-sizes 8,32 --runs 5 --run-timeout 300
# 2. FA3: pristine, every patch but fa3-draft-extend-graph, every patch.
orchestrate fa3-own-effect 1000 --attention-backend fa3 \
  --variants pristine,minus-fa3-draft-extend-graph,patched --compare minus-fa3-draft-extend-graph,patched \
  --batch-sizes 8,32 --runs 5 --run-timeout 300
# 1, round 3 (A B).
orchestrate fa3-vs-triton-r3 650 --variants patched@triton,patched@fa3 --compare patched@triton,patched@fa3 \
  --rounds 1 --batch-sizes 8,32 --runs 5 --run-timeout 300
note "all done"
