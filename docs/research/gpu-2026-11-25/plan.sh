#!/bin/bash
# Issue 35's GPU runs (2026-11-25), one machine, in the background (setsid).
# /tmp/b12: the 0.5.12.post1 bundle (all ten patches; minus-fa3-draft-extend-graph
# beside it); /tmp/pk_fa3/flash_ops.abi3.so: FA3's kernels (unpacked by the first call).
R=/tmp/pkrun
mkdir -p $R
note() { echo "[$(date +%T)] $*" >> $R/progress.log; }
orchestrate() {  # step timeout_s args...
  local name=$1 tmo=$2; shift 2
  [ -e $R/$name/.done ] && return
  mkdir -p $R/$name; note "start $name"
  (cd /tmp/b12 && PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout $tmo \
     python3 -m pk_gpu_e2e.orchestrate --bundle . --out $R/$name --sizes small --scenario standalone \
       --fa3-lib /tmp/pk_fa3/flash_ops.abi3.so "$@" > $R/$name/console.log 2>&1)
  note "end $name rc=$?"; touch $R/$name/.done
}
# 1. FA3 side by side with Triton, both patched (all ten patches): 3 ABBA rounds.
orchestrate fa3-vs-triton 1500 --variants patched@triton,patched@fa3 --compare patched@triton,patched@fa3 \
  --rounds 3 --batch-sizes 8,32 --runs 5 --run-timeout 300
# 2. FA3: pristine, every patch but fa3-draft-extend-graph, every patch (identity, syncs, own effect).
orchestrate fa3-own-effect 1000 --attention-backend fa3 \
  --variants pristine,minus-fa3-draft-extend-graph,patched --compare minus-fa3-draft-extend-graph,patched \
  --batch-sizes 8,32 --runs 5 --run-timeout 300
note "all done"
