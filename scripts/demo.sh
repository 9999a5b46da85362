#!/usr/bin/env bash
# Runs kvgate's demo on its embedded defaults: emulated workers behind the gateway,
# a short workload through it, and a result table. Does its own set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh sim
exec .venv/bin/kvgate demo "$@"
