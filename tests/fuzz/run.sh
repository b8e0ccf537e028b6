#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz for a fixed time from its seeds: those fuzz_write_seeds
# writes with the project's own encoders, and the corpus in the tree (tests/fuzz/corpus/<target>,
# left unchanged; new inputs go to a scratch directory) where there is one. Fails on the first
# crash, leak, UBSan report or timeout, and prints libFuzzer's final figures (executions,
# coverage) of each target.
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
((${#targets[@]})) || targets=(intake_decode sparse_payload coordinator config)
scratch=$(mktemp -d /tmp/sparsync-fuzz-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
"$build/tests/fuzz/fuzz_write_seeds" "$scratch/seeds"
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  [[ -x $bin ]] || { echo "run.sh: $bin not built (cmake --build $build --target fuzz_targets)" >&2; exit 1; }
  mkdir -p "$scratch/$t" "$scratch/$t-artifacts" "$scratch/seeds/$t"
  corpora=("$scratch/$t" "$scratch/seeds/$t")
  [[ -d $repo/tests/fuzz/corpus/$t ]] && corpora+=("$repo/tests/fuzz/corpus/$t")
  echo "== fuzz $t for ${seconds}s"
  # One job, a 10 s limit per input, crashes kept in the scratch directory for the log below.
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$scratch/$t-artifacts/" "${corpora[@]}" \
      > "$scratch/$t.log" 2>&1; then
    tail -60 "$scratch/$t.log"
    ls -l "$scratch/$t-artifacts" >&2
    # Whole, so that the input can be rebuilt from a CI log: `base64 -d > crash`.
    for a in "$scratch/$t-artifacts"/*; do
      [[ -f $a ]] || continue
      echo "$(basename "$a"), $(stat -c %s "$a") bytes, base64:"
      base64 -w 100 "$a" | head -c 65536
      echo
    done
    echo "run.sh: fuzz target $t failed" >&2
    exit 1
  fi
  grep -aE "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)" \
    "$scratch/$t.log" || true
  grep -aEo "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+" "$scratch/$t.log" | tail -1 || true
done
