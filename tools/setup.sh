#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine, in ./.venv (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# Pinned: on our CI machines 2.13.0 is a CPU build on local disk; an unpinned
# torch (or a package that pulls a newer one) downloads a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[runtime,test,plot]"
