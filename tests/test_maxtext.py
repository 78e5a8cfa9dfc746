"""A MaxText model tuned by its own remat knobs (``autoremat maxtext``).

Without MaxText: the knob settings offered over a model's tags and the overrides that
say a schedule. Where MaxText is installed (Python >= 3.12, ``autoremat[maxtext]``):
MaxText's config loader accepts every export and knob, and builds its policy's saved and
offloaded lists from exactly the names the schedule saves and offloads; with ``-m
slow``, a tiny decoder tuned end to end on the CPU, its pick compiled again by MaxText
to the figure the tune measured.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import autoremat
from autoremat._errors import ProblemError
from autoremat._models.layer_stack import CHECKPOINT_NAMES
from autoremat._models.maxtext import MaxTextModel, config_overrides
from autoremat._scan.checkpoint_names import TaggedValue
from autoremat._schedules import maxtext_names
from autoremat._schedules.policy import offload_names
from autoremat._search.maxtext_knobs import config_lines, knobs
from autoremat.cli import EXIT_USAGE, main

HAVE_MAXTEXT = importlib.util.find_spec("maxtext") is not None
needs_maxtext = pytest.mark.skipif(not HAVE_MAXTEXT, reason="MaxText is not installed "
                                   "(Python >= 3.12: pip install 'autoremat[maxtext]')")
#: A MaxText-shaped block's tags, with made-up costs (bytes, FLOPs).
COSTS = {n: TaggedValue(n, 1000 * (1 + i), 1e6 * (9 - i)) for i, n in enumerate(CHECKPOINT_NAMES)}
MODEL = MaxTextModel(("base_num_decoder_layers=4",), "base.yml", 4, True, COSTS)
TINY = ["hardware=cpu", "attention=dot_product", "base_emb_dim=64", "base_num_query_heads=4",
        "base_num_kv_heads=4", "head_dim=16", "base_mlp_dim=128", "base_num_decoder_layers=4",
        "max_target_length=64", "per_device_batch_size=1", "vocab_size=128"]


def test_a_schedule_is_maxtexts_remat_keys_or_one_clear_error() -> None:
    tags = CHECKPOINT_NAMES
    assert config_overrides(autoremat.nested([4]), tags) == ["remat_policy=full"]
    assert config_overrides(autoremat.nested([4], [{"save_only_these_names": [
        "query_proj", "key_proj", "value_proj"]}]), tags) == ["remat_policy=save_qkv_proj"]
    keys = config_overrides(autoremat.nested([4], [{"save_only_these_names": ["mlpwo"]}]),
                            tags)
    assert keys[0] == "remat_policy=custom" and "mlpwo=device" in keys
    assert "attention_out=remat" in keys and "decoder_layer_input=device" in keys
    moved = config_overrides(autoremat.nested([4], offload_names(["query_proj"])), tags)
    assert "query_proj=offload" in moved
    with pytest.raises(ProblemError, match=r"schedule: MaxText's remat_policy cannot run "
                       r"2x2 .*2 nested levels"):
        config_overrides(autoremat.nested([2, 2]), tags)


def test_the_knobs_are_full_maxtexts_presets_and_the_chains_each_once() -> None:
    cpu = knobs(MODEL, "cpu")
    labels = [k.label for k in cpu]
    assert labels[0] == "full" and cpu[0].overrides == ("remat_policy=full",)
    assert {"minimal", "save_qkv_proj", "save_dot_except_mlpwi"} <= set(labels)
    assert "minimal_with_context" not in labels  # acts as minimal on this block
    assert len({k.overrides for k in cpu}) == len(cpu)  # each setting once
    assert not any("=offload" in o for k in cpu for o in k.overrides)
    tpu = {k.label for k in knobs(MODEL, "tpu")}
    assert {"qkv_proj_offloaded", "minimal_offloaded"} <= tpu
    assert config_lines(cpu[0])[:2] == ["remat_policy: full", "scan_layers: true"]


def test_the_command_needs_overrides_as_key_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["maxtext", "--budget", "1GB", "num_layers"]) == EXIT_USAGE
    assert "OVERRIDE: expected MaxText's key=value, got 'num_layers'" in capsys.readouterr().err


@pytest.mark.skipif(HAVE_MAXTEXT, reason="MaxText is installed here")
def test_without_maxtext_the_command_says_how_to_install_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["maxtext", "--budget", "1GB", "base_num_decoder_layers=4"]) == EXIT_USAGE
    assert "pip install 'autoremat[maxtext]'" in capsys.readouterr().err


@needs_maxtext
def test_maxtext_loads_every_export_and_saves_the_names_it_says(tmp_path: Path) -> None:
    """Each knob and each MaxText preset as an export over the block's names: MaxText's
    config loader accepts it and its ``tensors_on_device`` / ``tensors_to_offload`` (what
    its custom policy saves and offloads) are the names the schedule saves and offloads
    (``decoder_layer_input`` kept where the schedule does not offload it)."""
    from autoremat._models.maxtext import base_config

    model = MaxTextModel((*TINY, f"base_output_directory={tmp_path}"), base_config(), 4,
                         True, COSTS)
    for knob in knobs(model, "tpu"):
        settings = model.settings(knob.config)
        form = autoremat.framework_policy(knob.schedule, CHECKPOINT_NAMES)
        if form.maxtext_preset:  # written as MaxText's own preset
            assert knob.overrides == (f"remat_policy={form.maxtext_preset}",)
            assert settings.remat_policy == form.maxtext_preset
            continue
        device = {n for n, v in form.maxtext if v == "device"}
        moved = {n for n, v in form.maxtext if v == "offload"}
        assert settings.remat_policy == "custom"
        assert set(settings.tensors_on_device) == device, knob.label
        assert set(settings.tensors_to_offload) == moved, knob.label
    assert all(hasattr(settings, n) for n in maxtext_names.NAMES)  # every key is MaxText's


@needs_maxtext
@pytest.mark.slow  # three compiles of MaxText's train step (tens of seconds each)
def test_a_tiny_maxtext_decoder_tuned_end_to_end(tmp_path: Path) -> None:
    from autoremat._measure.measure import measure
    from autoremat._models.maxtext import maxtext_model
    from autoremat._search.maxtext_knobs import tune_maxtext

    model = maxtext_model([*TINY, f"base_output_directory={tmp_path}"])
    assert set(model.tags) == set(CHECKPOINT_NAMES)  # MaxText's block tags as the stack
    result = tune_maxtext(model, 10**9, limit=2)
    assert [t.knob.label for t in result.tried][:2] == ["full", "minimal"]
    assert result.tried[-1].knob.scan_layers is False  # the pick, scan_layers flipped
    assert result.pick is not None and result.pick.measurement.step_seconds is not None
    full, minimal = (t.measurement.total_bytes for t in result.tried[:2])
    assert full is not None and minimal is not None and minimal > full  # it saves more
    pick = result.pick
    again = measure(model.problem(scan_layers=pick.knob.scan_layers), pick.knob.schedule,
                    run=False)
    assert again.total_bytes is not None and pick.measurement.total_bytes is not None
    assert abs(again.total_bytes - pick.measurement.total_bytes) <= \
        0.02 * pick.measurement.total_bytes


@needs_maxtext
@pytest.mark.slow  # five compiles of MaxText's train step
def test_maxtext_honours_the_names_the_export_writes(tmp_path: Path) -> None:
    """On MaxText's default (gated, dot-product) block, compiled by MaxText: ``context``
    and ``mlpwi`` name nothing (the same memory as ``full``); ``attention_out`` and
    ``mlpwi_0`` / ``mlpwi_1``, the names the export writes, are saved."""
    from autoremat._measure.measure import compile_step
    from autoremat._models.maxtext import MaxTextModel, base_config

    sizes = ["base_emb_dim=128", "head_dim=32", "base_mlp_dim=256", "max_target_length=512",
             "per_device_batch_size=2"]  # the layers' residuals decide the peak
    model = MaxTextModel((*TINY, *sizes, f"base_output_directory={tmp_path}"), base_config(), 4)

    def total(*keys: str) -> int:
        step, args = model.step(["remat_policy=custom", *keys] if keys else
                                ["remat_policy=full"])
        found = compile_step(step, args).measurement.total_bytes
        assert found is not None
        return found

    full = total()
    assert total("context=device") == full and total("mlpwi=device") == full
    assert total("attention_out=device") > full
    assert total("mlpwi_0=device", "mlpwi_1=device") > full
