#!/usr/bin/env bash
# Main job on a default tree: set up patchkit in .venv (first run only), fetch
# sglang 0.5.12.post1 from the registry into the cache, copy it, and inside the
# copy run what README.md's "What it looks like" shows, printing the same.
# Usage: bash scripts/demo.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-0.5.12.post1}"
# Progress goes to stderr at once; stdout is exactly the README's transcript.
if [ ! -x .venv/bin/patchkit ]; then
  echo "demo: setting up .venv (python3 -m venv .venv, pip install -e .; first run only) ..." >&2
  python3 -m venv .venv && .venv/bin/pip install -q -e .
fi
export PATH="$PWD/.venv/bin:$PATH"
echo "demo: fetching sglang $version into the cache (first run only) ..." >&2
pristine=$(patchkit fetch "$version")
work="${PATCHKIT_DEMO_DIR:-${TMPDIR:-/tmp}/patchkit-demo}/$version"
rm -rf "$work" && mkdir -p "$work" && cp -r "$pristine" "$work/sglang"
cd "$work/sglang"
say() { printf '\n$ %s\n' "$*"; "$@" 2>&1; }
printf '$ cd %s\n' "$work/sglang"

say patchkit apply
say patchkit verify
echo "demo: patchkit is installed in .venv: \`. .venv/bin/activate\` puts it on PATH" >&2
