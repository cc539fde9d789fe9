#!/usr/bin/env bash
# Main job on a default tree: set up patchkit in .venv, fetch sglang
# 0.5.12.post1 from the registry into the cache, copy it, apply every patch,
# verify, show status. Usage: bash scripts/demo.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-0.5.12.post1}"
[ -x .venv/bin/patchkit ] || { python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'; }
pk=.venv/bin/patchkit
pristine=$($pk fetch "$version")
work="${PATCHKIT_DEMO_DIR:-${TMPDIR:-/tmp}/patchkit-demo}/$version"
rm -rf "$work" && mkdir -p "$work" && cp -r "$pristine" "$work/sglang"
echo "== patchkit status $work/sglang"
$pk status "$work/sglang"
echo "== patchkit apply $work/sglang"
$pk apply "$work/sglang" || true
echo "== patchkit verify $work/sglang"
$pk verify "$work/sglang"
