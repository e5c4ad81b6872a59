#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine, in ./.venv (idempotent).
#   PYTHON=python3.11     the interpreter for the venv (default python3, 3.10 or newer)
#   TORCH_INDEX_URL=...   where to get torch (e.g. https://download.pytorch.org/whl/cpu for CPU-only images)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
# Pinned: on our CI machines 2.13.0 is a CPU build on local disk; an unpinned
# torch (or a package that pulls a newer one) downloads a multi-GB CUDA build.
"${pip[@]}" torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"${pip[@]}" -e ".[runtime,test,plot]"
# SkyPilot, the real client the launch tests check its task files with, in a venv of its own: its click
# pin conflicts with transformers' huggingface-hub. SKIP_SKYPILOT=1 leaves it out (the tests then skip).
if [ -z "${SKIP_SKYPILOT:-}" ] && [ ! -x .venv-skypilot/bin/sky ]; then
    "$PYTHON" -m venv .venv-skypilot
    .venv-skypilot/bin/python -m pip install -q --disable-pip-version-check skypilot==0.14.1
fi
# An editable install leaves our modules uncompiled; compile them once, so that every `sailor`
# process starts from bytecode even where PYTHONDONTWRITEBYTECODE keeps Python from caching it
# (about 35 ms of each `sailor plan`). Python recompiles in memory any file edited since.
.venv/bin/python -m compileall -q planner sailor_ext > /dev/null
