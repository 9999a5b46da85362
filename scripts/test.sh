#!/usr/bin/env bash
# Runs every check: lint (ruff), types (mypy --strict on src/), and the test suite.
# Does its own set-up on a fresh machine (virtualenv, install, redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,llamacpp,plots
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing it from Debian's packages" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null
  fi
fi
if ! command -v kubectl >/dev/null 2>&1; then
  # tests/test_deploy.py renders the Kubernetes manifests with `kubectl kustomize`.
  echo "kubectl not found; installing Debian's kubernetes-client" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq kubernetes-client >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq kubernetes-client >/dev/null
  fi
fi
# The dashboard's browser test drives Debian's chromium headless (Playwright, no download).
if [ ! -x /usr/bin/chromium ]; then
  echo "chromium not found; installing it from Debian's packages" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null
  fi
fi
echo "== ruff"
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
echo "== mypy (strict, src/)"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest "$@"
