#!/usr/bin/env bash
# Here, before borrowing an accelerator machine: the wheels it cannot get itself, into
# .device/wheels (ignored by git; carry `.device` with the checkout). A TPU machine has
# jax and its own package index (flax, optax, pyyaml, matplotlib, tqdm, pytest,
# hypothesis) but no optuna, and no network (docs/accelerators.md). There, run
# `source studies/device_setup.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/wheels
python -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.11}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .device/wheels \
    optuna alembic sqlalchemy greenlet mako markupsafe colorlog \
    zstandard pytest-xdist execnet ruff mypy mypy_extensions pathspec librt types-PyYAML types-tqdm
ls .device/wheels
