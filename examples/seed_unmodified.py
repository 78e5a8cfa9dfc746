"""The script of the Flax discussion this project started from, tuned as written.

``SimpleLSTM`` below is that script's model: ``nn.scan`` over an
``OptimizedLSTMCell``, and the ``@nn.remat`` on ``__call__`` that "did not
help". Nothing in it was changed for autoremat; two lines follow the flax 0.12
API (``OptimizedLSTMCell(features)``, ``initialize_carry(key, input_shape)``)
and the training loop sits under ``if __name__ == "__main__"``. ``problem``
at the end is all autoremat needs: the model's scan runs under each trial's
schedule through ``autoremat.remat_scans``::

    autoremat tune --problem examples/seed_unmodified.py:problem --budget 60MB
    python examples/seed_unmodified.py            # the script's own loop (unscheduled)

``SEED_SEQ_LEN`` sets T (default 10,000, the script's), ``SEED_STEPS`` the loop's steps.
"""
# ruff: noqa
# mypy: ignore-errors

import os

os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

import time
import functools
from flax import linen as nn
import jax
from jax import numpy as jnp
import optax
from flax.training.train_state import TrainState

import autoremat
import autoremat.linen


class SimpleLSTM(nn.Module):
    hidden_size: int
    output_dim: int
    seq2seq: bool

    def setup(self):
        self.cell = nn.OptimizedLSTMCell(self.hidden_size)  # flax 0.12: features
        self.linear = nn.Dense(self.output_dim)

    @functools.partial(
        nn.scan,
        variable_broadcast="params",
        in_axes=1,
        out_axes=1,
        split_rngs={"params": False},
    )
    def forward(self, carry, x):
        return self.cell(carry, x)
    
    @nn.remat # did not help!
    def __call__(self, embedded_inputs):
        batch_size, seq_length, _ = embedded_inputs.shape  # (B, T, X)

        initial_state = self.initialize_carry((batch_size,), self.hidden_size)
        _, outputs = self.forward(initial_state, embedded_inputs) # (B, T, D)

        if self.seq2seq:
            preds = self.linear(outputs) # (B, T, Y)
        else:
            preds = self.linear(outputs[:, -1]) # (B, Y)
        return preds

    def initialize_carry(self, batch_dims, hidden_size):
        return self.cell.initialize_carry(  # flax 0.12: (key, input_shape)
            jax.random.PRNGKey(0), (*batch_dims, hidden_size)
        )


hidden_size = 128
batch_size = 10
seq_length = int(os.environ.get("SEED_SEQ_LEN", 10000))
input_dim = 32
output_dim = 4
seq2seq = True


@jax.jit
def generate_data(key):
    x = jax.random.normal(key, shape=(batch_size, seq_length, input_dim))
    key, sub_key = jax.random.split(key)
    if seq2seq:
        y_shape = (batch_size, seq_length, output_dim)
    else:
        y_shape = (batch_size, output_dim)
    y = jax.random.normal(sub_key, shape=y_shape)
    return x, y


def problem() -> autoremat.Problem:
    """The script's train step (L2 loss, Adam 1e-3) for ``autoremat tune``."""
    model = SimpleLSTM(hidden_size=hidden_size, output_dim=output_dim, seq2seq=seq2seq)
    x, y = generate_data(jax.random.PRNGKey(1))
    params = jax.jit(model.init)(jax.random.PRNGKey(2), x)["params"]
    return autoremat.linen.problem(f"seed_unmodified(T={seq_length})", model, params, (x, y),
                                   optax.adam(learning_rate=1e-3))


if __name__ == "__main__":  # the script's loop, as written

    def create_train_state(key, model, x):
        params = jax.jit(model.init)(key, x)["params"]
        tx = optax.adam(learning_rate=1e-3)

        state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)
        return state

    @jax.jit
    def train_step(
        state: TrainState, x: jnp.array, y: jnp.array
    ):
        def loss_fn(params):
            preds = state.apply_fn(
                {"params": params},
                x,
            )
            losses = optax.l2_loss(
                preds, y
            )  # (B, T, Y) or (B, Y)
            loss = losses.mean()

            return loss

        grad_fn = jax.value_and_grad(loss_fn)
        loss, grads = grad_fn(state.params)

        new_state = state.apply_gradients(grads=grads)

        metrics = {"loss": loss}

        return new_state, metrics

    model = SimpleLSTM(hidden_size=hidden_size, output_dim=output_dim, seq2seq=seq2seq)

    key = jax.random.PRNGKey(1)
    key, sub_key = jax.random.split(key)
    x, y = generate_data(sub_key)

    key, sub_key = jax.random.split(key)
    state = create_train_state(sub_key, model, x)

    num_steps = int(os.environ.get("SEED_STEPS", 100000))
    for i in range(num_steps):
        t0 = time.time()
        key, sub_key = jax.random.split(key)
        x, y = generate_data(sub_key)
        state, metrics = train_step(state, x, y)
        print(i, jax.device_get(metrics), f"{time.time() - t0:.4f}")
