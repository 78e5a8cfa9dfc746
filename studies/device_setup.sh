# On a borrowed accelerator machine, from the checkout (with .device/ carried; made here
# by studies/device_wheels.sh): install what the project needs into /tmp/site, from the
# machine's own package index and the carried wheels, behind the machine's own jax.
# Source it: `source studies/device_setup.sh` (it sets PYTHONPATH and PATH).
if [ ! -d /tmp/site/optuna ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --only-binary=:all: \
    --index-url "${AUTOREMAT_DEVICE_INDEX:-file:///opt/pypi/simple}" \
    --find-links .device/wheels --target /tmp/site \
    flax optax optuna pyyaml matplotlib tqdm zstandard hypothesis pytest pytest-xdist ruff mypy \
    types-PyYAML types-tqdm 2>&1 | grep -v -i -E "warning|notice" | tail -5
fi
# the machine's jax first, then what was installed, then this checkout
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site:$PWD"
# the console script `pip install -e .` would make (tests/test_cli.py runs `autoremat`)
mkdir -p /tmp/site/bin
printf '#!/bin/sh\nexec python3 -m autoremat.cli "$@"\n' > /tmp/site/bin/autoremat
chmod +x /tmp/site/bin/autoremat
export PATH="/tmp/site/bin:$PATH"
