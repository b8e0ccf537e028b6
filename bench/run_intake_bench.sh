#!/usr/bin/env bash
# Intake round-trip benchmark: starts one sparsyncd (one node, one worker, compressor none) in a
# private directory, runs bench/intake_roundtrip against it, and stops it.
#   bench/run_intake_bench.sh [build-dir]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
dir=$(mktemp -d)
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -rf "$dir"' EXIT
export SPARSYNC_SOCKET=$dir/d.sock SPARSYNC_JOB_TOKEN=bench SPARSYNC_LOG_LEVEL=warn SPARSYNC_COMPRESSOR=none
"$build/daemon/sparsyncd" &
daemon=$!
for _ in $(seq 100); do [[ -S $SPARSYNC_SOCKET ]] && break; sleep 0.05; done
"$build/bench/intake_roundtrip"
