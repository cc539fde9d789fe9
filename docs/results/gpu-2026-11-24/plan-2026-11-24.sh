#!/bin/bash
# Issue 23's GPU runs of 2026-11-24, in priority order, on one machine in the
# background (setsid): each device call lasts at most 10 minutes, the work about 30.
# Bundles: 0.5.12.post1 copied to /tmp/b12 by the first call, 0.5.10 to /tmp/b10 by
# the second. Each step writes /tmp/pkrun/<step>/ (results.json, tables, console.log);
# the calls tar /tmp/pkrun into $OUT. A step already done is skipped.
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

probe() {  # step args...: the bs-1 acceptance probe, on 0.5.12.post1's pristine tree
  local name=$1; shift
  [ -e $R/$name/.done ] && return
  mkdir -p $R/$name; note "start $name"
  local sha; sha=$(sha256sum /tmp/b12/site/common.tar.gz | cut -c1-16)
  local W=/tmp/pk_gpu_e2e
  (cd /tmp/b12 && PYTHONUNBUFFERED=1 SGLANG_ENABLE_SPEC_V2=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
     PYTHONPATH=$W/trees/0.5.12.post1/pristine:$(ls -d $W/site/0.5.12.post1-* | head -1):$W/site/common-$sha:e2e \
     timeout 300 python3 -m pk_gpu_e2e.accept_probe --models-dir $W/models --out $R/$name/probe.json "$@" \
     > $R/$name/console.log 2>&1)
  note "end $name rc=$?"; touch $R/$name/.done
}

B12=/tmp/b12 B10=/tmp/b10
# 1. Mixed traffic, pristine and patched (the 0.5.13 side was recorded on 2026-11-23).
orchestrate traffic-0.5.12.post1-small $B12 660 --sizes small --workloads mixed \
  --batch-sizes 8,32 --max-new-tokens 512 --runs 3 --run-timeout 320
# 2. The sync's cost in one process: small, EAGLE3, uniform and mixed traffic.
orchestrate alt-0.5.12.post1-small $B12 760 --sizes small --alternate 20 \
  --workloads uniform,mixed --batch-sizes 1,8,32 --max-new-tokens 128 --run-timeout 740
# 3. Accepted runs at the 8B shape (two 8B copies: target and draft).
orchestrate accepted-0.5.12.post1-8b $B12 900 --sizes 8b --scenario standalone \
  --mem-fraction-static 0.3 --batch-sizes 1,8,32 --runs 3 --run-timeout 440
# 4. Accepted runs on 0.5.10 (its bundle arrives with the second call).
for _ in $(seq 120); do [ -e $B10/.copied ] && break; sleep 5; done
orchestrate accepted-0.5.10-small $B10 660 --sizes small --scenario standalone \
  --batch-sizes 1,8,32 --runs 3 --run-timeout 320
# 5. The sync's cost at the 8B shape.
orchestrate alt-0.5.12.post1-8b $B12 700 --sizes 8b --alternate 20 --workloads uniform \
  --batch-sizes 1,8,32 --max-new-tokens 128 --run-timeout 680
# 6. Why bs 1 does not accept: the prompt or the batch size.
probe probe-0.5.12.post1-small
# 7. The sync's cost with accepted steps.
orchestrate alt-standalone-0.5.12.post1-small $B12 600 --sizes small --scenario standalone \
  --alternate 20 --batch-sizes 8,32 --max-new-tokens 256 --run-timeout 580
note "all done"
