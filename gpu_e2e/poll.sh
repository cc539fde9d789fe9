#!/bin/bash
# One polling call of a plan running on the device machine (issue 67, 2026-11-28c): wait SLEEP
# seconds, print the plan's progress and each duel's table, and bring every step's JSON and
# tables back in $OUT/results.tgz. Every poll brings them back because a machine that goes back
# between calls (30 s without one) takes /tmp with it: the first lease of 2026-11-28c lost its
# grid's JSON that way. Engine logs stay behind (their size; the tables cite none).
#   SLEEP=240 R=/tmp/pkrun bash gpu_e2e/poll.sh
R=${R:-/tmp/pkrun}
SLEEP=${SLEEP:-0}
TAIL=${TAIL:-8}
# the wait ends early once the plan says "all done" (the last poll then holds the machine no longer)
for _ in $(seq "$SLEEP"); do grep -q 'all done' "$R/progress.log" 2>/dev/null && break; sleep 1; done
tail -n "$TAIL" "$R/progress.log" 2>/dev/null
for md in "$R"/*/duel.md; do
  [ -f "$md" ] || continue
  echo "== $(basename "$(dirname "$md")")"
  grep '^|' "$md" | grep -v '^|---'
done
if [ -n "${OUT:-}" ] && [ -d "$R" ]; then
  # each engine log's end (a failure's traceback) travels; the whole logs stay behind
  for log in "$R"/*/engine-*.log; do [ -f "$log" ] && tail -c 16000 "$log" > "${log%.log}.tail"; done
  tar czf "$OUT/results.tgz" -C "$R" --exclude='engine*.log' --exclude='*.profile-*' .
  echo "results.tgz: $(du -k "$OUT/results.tgz" | cut -f1) KiB"
  # HARVEST=1's compiled caches come back with the poll after they are packed (2026-11-29b packed
  # 8 MiB of FlashInfer and Triton builds that no call fetched, and the machine took them back):
  # up to four 15 MiB parts, CACHES_BACK=0 to leave them. Once only ($R/caches.sent): a call
  # brings back 8 files, and 2026-11-29f's later polls, the parts again in four of them, left a
  # duel's JSON behind
  if [ "${CACHES_BACK:-1}" = 1 ] && [ ! -e "$R/caches.sent" ] && grep -q 'caches packed (rc 0)' "$R/progress.log" 2>/dev/null; then
    for part in "${CACHE_ROOT:-/tmp}"/caches-[a-d]; do [ -d "$part" ] && cp -r "$part" "$OUT"/; done
    ls -d "$OUT"/caches-* 2>/dev/null | sed 's/^/caches back: /' && touch "$R/caches.sent"
  fi
fi
