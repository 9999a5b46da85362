#!/usr/bin/env bash
# Runs test files in P concurrent pytest processes, R rounds, on a loaded machine;
# every failure's output is kept. Exit status 1 if any run failed.
# Usage: scripts/stress.sh [-p PROCS] [-r ROUNDS] TEST_PATH...
#   bash scripts/stress.sh -p 4 -r 20 tests/gateway/test_http1.py tests/gateway/test_upstream.py
set -uo pipefail
cd "$(dirname "$0")/.."
procs=4
rounds=20
while getopts "p:r:" opt; do
  case "$opt" in
    p) procs="$OPTARG" ;;
    r) rounds="$OPTARG" ;;
    *) echo "usage: $0 [-p PROCS] [-r ROUNDS] TEST_PATH..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "$#" -gt 0 ] || { echo "usage: $0 [-p PROCS] [-r ROUNDS] TEST_PATH..." >&2; exit 2; }
out="$(mktemp -d "${TMPDIR:-/tmp}/kvgate-stress.XXXXXX")"
failed=0
for round in $(seq 1 "$rounds"); do
  pids=()
  for p in $(seq 1 "$procs"); do
    # -p no:cacheprovider: concurrent runs must not share pytest's cache files.
    .venv/bin/pytest -q -p no:cacheprovider "$@" >"$out/r${round}p${p}.log" 2>&1 &
    pids+=("$!")
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      failed=$((failed + 1))
      echo "round $round process $((i + 1)) FAILED: $out/r${round}p$((i + 1)).log"
    fi
  done
done
total=$((rounds * procs))
echo "$((total - failed)) of $total runs passed ($rounds rounds x $procs processes); logs in $out"
[ "$failed" -eq 0 ]
