#!/bin/bash
# Which patch costs the eager step? (issue 67, 2026-11-28c) One duel per GPU: pristine, patched and
# two trees of every patch but one (the bundle's `--minus ID` variants), FA3 at the small shape,
# eager batches only (bs 64 and 128 above cuda_graph_max_bs 32), ROUNDS rounds. Waits for the grid's
# plan to end first (AFTER: its progress.log says "all done").
#   LANES_MINUS="fa3-spec-v2,seq-lens-host-bound spec-v2-decode-copies,verify-wait-on-stream" bash gpu_e2e/minus_plan.sh
R=${R:-/tmp/pkrun}
BM=${BM:-/tmp/b12m}
FA3_12=${FA3_12:-/tmp/pk_fa3/flash_ops.abi3.so}
ROUNDS=${ROUNDS:-10}
NEW_TOKENS=${NEW_TOKENS:-128}
AFTER=${AFTER:-$R/progress.log}
LANES_MINUS=${LANES_MINUS:-}  # one word per GPU: the patch ids (comma list) left out of that GPU's trees
# SHAPE=8b (2026-11-28d on: FA3 8B eager ran below pristine in every round, with or without
# fa3-spec-v2): the 8B shape, whose engines share a GPU in 60000 KV tokens each; BATCHES: the sizes
SHAPE=${SHAPE:-small}
BATCHES=${BATCHES:-64,128}
TOKENS=200000; [ "$SHAPE" = 8b ] && TOKENS=60000
export PK_E2E_COUNTERS_OFF=1
while [ -e "$AFTER" ] && ! grep -q "all done" "$AFTER"; do sleep 5; done
note() { echo "[$(date +%T)] $*" >> "$R/progress.log"; }
lane=0
for pair in $LANES_MINUS; do
  eng=(--engine "pristine=$BM:0.5.12.post1:pristine" --engine "patched=$BM:0.5.12.post1:patched")
  for id in ${pair//,/ }; do eng+=(--engine "minus-$id=$BM:0.5.12.post1:minus-$id"); done
  name=minus_duel-gpu$lane; mkdir -p "$R/$name"; note "gpu $lane: start $name ($pair)"
  (cd "$BM" && CUDA_VISIBLE_DEVICES=$lane TRITON_CACHE_DIR=/tmp/triton$lane TORCHINDUCTOR_CACHE_DIR=/tmp/inductor$lane \
     PYTHONUNBUFFERED=1 PYTHONPATH=e2e timeout 900 python3 -m pk_gpu_e2e.duel --out "$R/$name" --work /tmp/pkm$lane \
     "${eng[@]}" --fa3-lib "$BM:$FA3_12" --size "$SHAPE" --attention-backend default --batch-sizes "$BATCHES" \
     --rounds "$ROUNDS" --max-new-tokens "$NEW_TOKENS" --base-port $((41000 + 2000 * lane)) \
     --compare "$(printf 'pristine:patched'; for id in ${pair//,/ }; do printf ',pristine:minus-%s,patched:minus-%s' $id $id; done)" \
     --engine-extra "{\"cuda_graph_max_bs\": 32, \"max_running_requests\": 128, \"max_total_tokens\": $TOKENS}" \
     > "$R/$name/console.log" 2>&1; note "gpu $lane: end $name rc=$?") &
  lane=$((lane + 1))
done
wait
note "minus done"
