"""MaxText's names and presets, pinned from its source, against the export and the stack.

``autoremat/_schedules/maxtext_names.json`` is ``studies/maxtext_inventory.py``'s reading
of a MaxText release. Here, without MaxText or a network: every preset, written as a
pick, exports as MaxText's ``custom`` keys that rebuild it and is named as that preset;
the built-in stack tags only names MaxText's layers tag and its custom policy reads; the
inventory script reads a small MaxText-shaped source tree as MaxText's own. Where MaxText
is installed, the pinned file is what the script reads from it (same version).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autoremat
from autoremat._models.layer_stack import CHECKPOINT_NAMES
from autoremat._schedules import maxtext_names
from autoremat._schedules.frameworks import DEVICE, LAYER_INPUT, OFFLOAD
from autoremat._schedules.policy import Policy

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "maxtext_inventory.py"
PINNED = Path(maxtext_names.__file__).with_name("maxtext_names.json")
#: Presets that act exactly as another (an old alias; quantization names a quantized model
#: tags): the export names the other.
ALIASES = {"minimal_flash": "minimal_with_context"}


def test_the_pinned_file_is_consistent() -> None:
    data = json.loads(PINNED.read_text())
    assert data["version"] == maxtext_names.VERSION and maxtext_names.VERSION
    assert set(maxtext_names.NAMES) == set(data["custom_reads"])  # each read is a key
    assert set(maxtext_names.NAMES) <= set(maxtext_names.CONFIG_KEYS)
    assert {"attention_out", "mlpwi_0", "mlpwi_1", "kv_proj", "moe_mlpwo", "mla_q"} <= set(
        maxtext_names.NAMES)
    assert maxtext_names.PRESETS["full"] == ((), ())
    assert set(maxtext_names.SEARCHED + maxtext_names.SEARCHED_OFFLOADED) <= set(
        maxtext_names.PRESETS)
    # a flash kernel's residual is context; the dot-product path's output is attention_out
    assert maxtext_names.FLASH_RESIDUAL in data["kernel_residual_tags"]
    assert "attention_out" in maxtext_names.TAGS


@pytest.mark.parametrize("label", sorted(set(maxtext_names.PRESETS) - {"full"}))
def test_each_preset_as_a_pick_exports_as_itself(label: str) -> None:
    """A pick saving / offloading exactly what the preset does, on a model tagging every
    name it lists, writes keys that rebuild it, and is named as the preset."""
    saved, moved = maxtext_names.PRESETS[label]
    known = [n for n in (*saved, *moved) if n in maxtext_names.NAMES]
    policy = (Policy("save_only_these_names", args=saved) if not moved else
              Policy("save_and_offload_only_these_names", kwargs=(
                  ("names_which_can_be_saved", saved), ("names_which_can_be_offloaded", moved),
                  ("offload_src", "device"), ("offload_dst", "pinned_host"))))
    form = autoremat.framework_policy(autoremat.nested([4], [policy]),
                                      (LAYER_INPUT, *known))
    assert form.maxtext_ok, form.maxtext_why_not
    keys = dict(form.maxtext)
    assert {n for n, v in keys.items() if v == DEVICE} - {LAYER_INPUT} == set(saved) & set(known)
    assert {n for n, v in keys.items() if v == OFFLOAD} == set(moved) & set(known)
    unread = (set(saved) | set(moved)) - set(known)  # quantization: not a custom key
    if not unread:
        assert form.maxtext_preset == ALIASES.get(label, label)


def test_the_built_in_stack_uses_maxtexts_own_names() -> None:
    assert set(CHECKPOINT_NAMES) <= maxtext_names.TAGS
    assert set(CHECKPOINT_NAMES) <= set(maxtext_names.NAMES)
    assert "context" not in CHECKPOINT_NAMES and "mlpwi" not in CHECKPOINT_NAMES


FAKE = {
    "version.py": '__version__ = "9.9.9"\n',
    "configs/base.yml": textwrap.dedent("""\
        remat_policy: 'full'
        decoder_layer_input: 'device' # a comment
        context: 'remat'
        mlpwi_0: 'remat'
        mlpwi_1: 'remat'
        unrelated: 'fast'
        """),
    "configs/types.py": textwrap.dedent("""\
        class MaxTextConfig:
          decoder_layer_input: RematLocation = Field(RematLocation.DEVICE)
          context: RematLocation = Field(RematLocation.REMAT)
          mlpwi_0: RematLocation = Field(RematLocation.REMAT)
          mlpwi_1: RematLocation = Field(RematLocation.REMAT)
          def validate(self):
            tensors = ["decoder_layer_input", "mlpwi_0", "mlpwi_1"]
            self.tensors_on_device = [t for t in tensors if getattr(self, t) == "device"]
        """),
    "layers/nnx_decoders.py": textwrap.dedent("""\
        class Decoder:
          def minimal_policy(self, with_context=False):
            names = ["mlpwi_0", "mlpwi_1"]
            if with_context:
              names.append("context")
            return jax.checkpoint_policies.save_only_these_names(*names)
          def get_remat_policy(self):
            if remat_policy == "minimal":
              policy = self.minimal_policy()
            elif remat_policy in {"minimal_with_context", "minimal_flash"}:
              policy = self.minimal_policy(with_context=True)
            elif remat_policy == "gate_offloaded":
              policy = jax.checkpoint_policies.save_and_offload_only_these_names(
                  names_which_can_be_saved=[], names_which_can_be_offloaded=["mlpwi_0"],
                  offload_src="device", offload_dst="pinned_host")
            else:
              assert remat_policy == "full", "unknown"
              policy = None
            return policy
        """),
    "layers/linears.py": textwrap.dedent("""\
        def mlp(self, x, idx):
          dense_name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
          x = checkpoint_name(x, "mlp" + dense_name)
          return attention(x, residual_checkpoint_name="context")
        """),
}


def test_the_inventory_reads_a_maxtext_shaped_tree(tmp_path: Path) -> None:
    for rel, text in FAKE.items():
        path = tmp_path / "src" / "maxtext" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    out = tmp_path / "names.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["version"] == "9.9.9"
    assert data["base_yml_keys"] == ["decoder_layer_input", "context", "mlpwi_0", "mlpwi_1"]
    assert data["config_keys"] == {"decoder_layer_input": "device", "context": "remat",
                                   "mlpwi_0": "remat", "mlpwi_1": "remat"}
    assert data["custom_reads"] == ["decoder_layer_input", "mlpwi_0", "mlpwi_1"]
    assert data["presets"] == {
        "minimal": {"saved": ["mlpwi_0", "mlpwi_1"], "offloaded": []},
        "minimal_with_context": {"saved": ["mlpwi_0", "mlpwi_1", "context"], "offloaded": []},
        "minimal_flash": {"saved": ["mlpwi_0", "mlpwi_1", "context"], "offloaded": []},
        "gate_offloaded": {"saved": [], "offloaded": ["mlpwi_0"]},
        "full": {"saved": [], "offloaded": []}}
    # "mlp" + "wi" matches no key; "mlp" + "wi_*" matches the gated MLP's two
    assert set(data["tags"]) == {"mlpwi", "mlpwi_0", "mlpwi_1"}
    assert data["kernel_residual_tags"] == {"context": ["maxtext/layers/linears.py"]}


def test_the_inventory_refuses_a_folder_that_is_not_maxtext(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "path:" in proc.stderr and "configs/base.yml" in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("maxtext") is None,
                    reason="MaxText is not installed (Python >= 3.12: pip install maxtext)")
def test_the_pinned_file_is_the_installed_maxtexts_reading(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("maxtext")
    assert spec is not None and spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    out = tmp_path / "names.json"
    subprocess.run([sys.executable, str(SCRIPT), str(package), "--out", str(out)], check=True,
                   timeout=120)
    read, pinned = json.loads(out.read_text()), json.loads(PINNED.read_text())
    if read["version"] != pinned["version"]:
        pytest.skip(f"MaxText {read['version']} installed; the file pins {pinned['version']}")
    assert read == pinned
