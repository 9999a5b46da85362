#!/usr/bin/env bash
# Runs every check: lint (ruff), types (mypy --strict on src/), and the test suite.
# Does its own set-up on a fresh machine: virtualenv and install, then the Debian
# packages the tests drive (redis-server, kubectl, chromium, haproxy) where they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,llamacpp,plots

apt_updated=0
need() {  # need COMMAND PACKAGE WHY: install PACKAGE from Debian when COMMAND is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "$1 not found; installing Debian's $2 ($3)" >&2
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if [ "$apt_updated" = 0 ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  $sudo apt-get install -y -qq "$2" >/dev/null
}
need redis-server redis-server "the store and replica tests start their own Redis"
need kubectl kubernetes-client "tests/test_deploy.py renders the manifests with kubectl kustomize"
need chromium chromium "the dashboard's browser test drives it headless through Playwright"
need haproxy haproxy "the peers benchmark's small run puts HAProxy in front of a fleet"

echo "== ruff"
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
echo "== mypy (strict, src/)"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest "$@"
