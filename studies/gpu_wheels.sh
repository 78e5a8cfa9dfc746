#!/usr/bin/env bash
# Wheels of optuna and what it needs (cp312, x86_64), for a GPU machine that has jax and
# flax but no optuna and no package index (shared/reference/gpu.md). Run here, then carry
# .gpu/ with the checkout; there, before studies/gpu_check.py:
#   pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
#   XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site \
#       python3 studies/gpu_check.py --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/wheels
python -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
    --implementation cp --platform manylinux2014_x86_64 -d .gpu/wheels \
    optuna alembic sqlalchemy greenlet mako markupsafe colorlog
ls .gpu/wheels
