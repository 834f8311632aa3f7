#!/usr/bin/env bash
# Install tierserve (editable, extras redis and gpu) and what the GPU check runs into the venv
# VENV, created from PY with --system-site-packages when missing (so a cupy or torch the machine
# already has is used).  WHEELS: install from that folder only.  DRY=1: no gpu extra, no torch.
# (check.sh passes PY's own venv as VENV when PY runs in one: a venv made from a venv's Python
# would not see that venv's packages, and cuda-pathfinder, which finds cupy's CUDA libraries,
# searches only site.getsitepackages().)
# Called by check.sh.
set -euo pipefail
: "${VENV:?}" "${ROOT:?}" "${PY:=python3}" "${WHEELS:=}" "${DRY:=0}"
VPY=$VENV/bin/python
if [ ! -x "$VPY" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
pip=("$VPY" -m pip install --disable-pip-version-check -q)
[ -n "$WHEELS" ] && pip+=(--no-index --find-links "$WHEELS")
extras=redis
if "$VPY" -c "import cupy" 2>/dev/null; then
  echo "cupy $("$VPY" -c 'import cupy; print(cupy.__version__)') already installed: the gpu extra is not reinstalled"
elif [ "$DRY" = 0 ]; then
  extras=$extras,gpu
fi
"${pip[@]}" -e "$ROOT[$extras]"
"$VPY" -c "import pytest, hypothesis, pytest_timeout" 2>/dev/null \
  || "${pip[@]}" pytest pytest-timeout hypothesis
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ "$DRY" = 0 ]; then "${pip[@]}" torch
  else echo "torch not installed: the dry run skips the PyTorch peer"; fi
fi
"$VPY" -c "import tierserve.cache, tierserve.server; print('tierserve installed')"
