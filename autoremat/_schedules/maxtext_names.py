"""MaxText's remat names and presets, as its own source defines them (a pinned file).

``maxtext_names.json`` beside this module is written by ``studies/maxtext_inventory.py``
from a MaxText release's source (parsed, never imported): the config keys
``remat_policy: custom`` reads, every ``checkpoint_name`` tag of its layers, and what
each ``remat_policy`` preset saves or offloads. Rerun that script on a newer MaxText to
follow its names; ``tests/test_maxtext_names.py`` checks the export against the file.

Names worth knowing (MaxText 0.2.5): the attention's output before its projection is
``attention_out`` on every attention kind; ``context`` tags only the flash kernels'
saved residuals (their output and log-sum-exp), so on the dot-product path it names
nothing. A gated MLP (``mlp_activations: [silu, linear]``, MaxText's default) tags
``mlpwi_0`` and ``mlpwi_1``; ``mlpwi`` exists only for a one-activation MLP. The presets
list names a model may lack (``kv_proj``, ``qkv_proj``): a preset acts on the names the
model tags (``over``). Pure Python: nothing here imports jax.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Final


def _load() -> dict[str, Any]:
    text = resources.files("autoremat._schedules").joinpath("maxtext_names.json").read_text(
        encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


_DATA: Final = _load()
#: The MaxText release the file was read from.
VERSION: Final[str] = str(_DATA["version"])
#: The names ``remat_policy: custom`` reads, in base.yml's order: the keys an export writes.
NAMES: Final[tuple[str, ...]] = tuple(
    n for n in _DATA["base_yml_keys"] if n in _DATA["custom_reads"])
#: Every remat key MaxText's config accepts (a few, such as ``engram``, the custom policy
#: does not read).
CONFIG_KEYS: Final[tuple[str, ...]] = tuple(_DATA["config_keys"])
#: Every ``checkpoint_name`` tag in MaxText's layers and models.
TAGS: Final[frozenset[str]] = frozenset(_DATA["tags"])
#: The tag the flash kernels give their saved residuals (``residual_checkpoint_name``).
FLASH_RESIDUAL: Final = "context"
#: ``remat_policy`` presets: label -> (names saved, names offloaded to pinned host).
PRESETS: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    label: (tuple(p["saved"]), tuple(p["offloaded"])) for label, p in _DATA["presets"].items()}
#: The presets a search offers on a model with tags (``over``), in MaxText's order of
#: speed (fastest first); ``full`` is the search's seed, ``minimal_flash`` an old alias
#: of ``minimal_with_context``, the quantization ones need a quantized model.
SEARCHED: Final = ("minimal_with_context", "minimal", "save_dot_with_context_except_mlp",
                   "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj",
                   "save_out_proj")
#: The offloading presets a search offers where offload is (``over``).
SEARCHED_OFFLOADED: Final = ("qkv_proj_offloaded", "minimal_offloaded")


def over(label: str, tags: frozenset[str] | set[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What preset ``label`` saves and offloads of a model tagging ``tags``: its lists
    restricted to them (a name the model lacks saves nothing), in the preset's order."""
    saved, moved = PRESETS[label]
    return tuple(n for n in saved if n in tags), tuple(n for n in moved if n in tags)


def presets_over(tags: frozenset[str] | set[str], labels: tuple[str, ...]
                 ) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The presets of ``labels`` that act on ``tags`` (save or offload one of them), each
    distinct action once: where two act alike (``minimal`` and ``minimal_with_context``
    on a model without ``context``), the one listing fewest names the model lacks."""
    out: dict[tuple[frozenset[str], frozenset[str]], tuple[int, str]] = {}
    for label in labels:
        saved, moved = over(label, tags)
        if not saved and not moved:
            continue
        key = (frozenset(saved), frozenset(moved))
        lacking = sum(len(x) for x in PRESETS[label]) - len(saved) - len(moved)
        if key not in out or lacking < out[key][0]:
            out[key] = (lacking, label)
    chosen = {label for _, label in out.values()}
    return {label: over(label, tags) for label in labels if label in chosen}


def preset_named(saved: set[str], moved: set[str], tags: frozenset[str] | set[str]) -> str:
    """The preset that saves exactly ``saved`` and offloads exactly ``moved`` of a model
    tagging ``tags`` (``decoder_layer_input`` aside: every preset keeps it), or ""."""
    if not saved and not moved:
        return "full"
    found = presets_over(tags, tuple(PRESETS))
    return next((label for label, (s, m) in found.items()
                 if set(s) == saved and set(m) == moved), "")
