"""``export`` in the user's framework: MaxText's ``remat_policy: custom`` keys, Flax's remat
policy, and the nearest measured trial they can write when the pick has no such form.

The studies here are made of recorded figures (no tune: seconds); the figures the
command prints are the ones recorded, and the translation is checked against jax's own
policies."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest

import autoremat
from autoremat._schedules import save_schedule
from autoremat._schedules.base import Schedule
from autoremat._schedules.policy import offload_names
from autoremat._search.export_forms import framework_export, nearest_expressible
from autoremat.cli import EXIT_NO_FORM, EXIT_OK, EXIT_USAGE, main
from tests.helpers import add_measured_trial

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: The built-in layer stack's tags (``autoremat._models.layer_stack.CHECKPOINT_NAMES``).
TAGS = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "context", "out_proj",
        "mlpwi", "mlpwo")
SAVE_CONTEXT = autoremat.nested([4], [{"save_only_these_names": ["context", "mlpwo"]}])
#: (schedule, total bytes, step seconds); the budget is 1000 bytes.
TRIALS: list[tuple[Schedule, int, float | None]] = [
    (autoremat.nested([4], "nothing_saveable"), 100, 2.0),
    (SAVE_CONTEXT, 300, 1.5),
    (autoremat.nested([2, 2], ["nothing_saveable", {"save_only_these_names": ["context"]}]),
     200, 1.0),  # the pick: the fastest that fits, two levels
    (autoremat.groups([(2, {"save_only_these_names": ["context"]}), (2, "nothing_saveable")]),
     250, 1.2),
    (autoremat.nested([4], "none"), 5000, None),  # over the budget
]


def _study(trials: Sequence[tuple[Schedule, int, float | None]], budget: int = 1000,
           storage: str | None = None, name: str = "s") -> Any:
    """A study of recorded measurements, as ``tune`` writes them (with the tags' costs)."""
    study = optuna.create_study(directions=["minimize", "minimize"], storage=storage,
                                study_name=name)
    study.set_user_attr("budget_bytes", budget)
    study.set_user_attr("seq_len", 4)
    study.set_user_attr("name_costs", [{"name": n, "bytes_per_layer": 8, "bytes": 32,
                                        "flops_per_layer": 1e6} for n in TAGS])
    for schedule, total, step in trials:
        add_measured_trial(study, schedule, total, step)
    return study


def test_one_policy_per_layer_is_a_maxtext_block_and_a_flax_policy() -> None:
    form = autoremat.framework_policy(SAVE_CONTEXT, TAGS)
    assert form.maxtext_ok and form.flax_ok and form.why_not == ""
    assert form.maxtext == (("decoder_layer_input", "device"), ("context", "device"),
                            ("mlpwi", "remat"), ("mlpwo", "device"), ("query_proj", "remat"),
                            ("key_proj", "remat"), ("value_proj", "remat"),
                            ("out_proj", "remat"))
    assert form.unknown == () and form.maxtext_preset == ""
    assert form.flax_policy == ("jax.checkpoint_policies.save_only_these_names("
                                "'context', 'mlpwo')")
    # the pick recomputes decoder_layer_input; MaxText never does, and says so
    assert any("decoder_layer_input" in note for note in form.notes)


def test_maxtext_presets_and_offload_and_unknown_names() -> None:
    qkv = autoremat.framework_policy(autoremat.nested([4], [{"save_only_these_names": [
        "query_proj", "key_proj", "value_proj"]}]), TAGS)
    assert qkv.maxtext_preset == "save_qkv_proj"
    assert autoremat.framework_policy(autoremat.nested([4]), TAGS).maxtext_preset == "full"
    moved = autoremat.framework_policy(
        autoremat.nested([4], offload_names(["context"])), ("context", "mlpwo"))
    assert moved.maxtext == (("context", "offload"), ("mlpwo", "remat"))
    assert moved.flax_policy == (
        "jax.checkpoint_policies.save_and_offload_only_these_names(names_which_can_be_"
        "offloaded=['context'], names_which_can_be_saved=[], offload_dst='pinned_host', "
        "offload_src='device')")
    mine = autoremat.framework_policy(
        autoremat.nested([6], [{"save_only_these_names": ["my_gate"]}]), ("my_gate", "mlpwi"))
    assert mine.maxtext_ok and mine.maxtext == (("mlpwi", "remat"),)
    assert mine.unknown == (("my_gate", "device"),)  # flagged: MaxText cannot save it


def test_what_maxtext_cannot_say_flax_can() -> None:
    for policy in ("checkpoint_dots_with_no_batch_dims", "none",
                   {"save_anything_except_these_names": ["mlpwi"]}):
        form = autoremat.framework_policy(autoremat.nested([4], [policy]), TAGS)
        assert form.flax_ok and not form.maxtext_ok and form.maxtext == ()
        assert "MaxText's custom policy" in form.maxtext_why_not
    assert autoremat.framework_policy(autoremat.nested([4], "none")).flax_policy == ""
    same = autoremat.groups([(2, "dots_saveable"), (2, "dots_saveable")])
    assert autoremat.framework_policy(same).flax_ok  # groups sharing one policy


@pytest.mark.parametrize("schedule, why", [
    (autoremat.nested([2, 2]), "2 nested levels remat chunks of layers (2x2)"),
    (autoremat.groups([(2, "dots_saveable"), (2, "nothing_saveable")]),
     "its 2 groups of layers have different policies"),
    (autoremat.binomial(2), "the binomial kind remats chunks of layers"),
])
def test_what_neither_can_say(schedule: Schedule, why: str) -> None:
    form = autoremat.framework_policy(schedule, TAGS)
    assert not form.flax_ok and not form.maxtext_ok and form.policy is None
    assert form.why_not.startswith(why)


def test_the_flax_policy_is_jax_policy_and_the_maxtext_block_rebuilds_it() -> None:
    """``flax_policy`` evaluates to a jax policy; MaxText's rule (device names saved,
    offload names offloaded) over the block saves the same tags as the pick."""
    import jax
    from jax.ad_checkpoint import checkpoint_name, print_saved_residuals

    form = autoremat.framework_policy(SAVE_CONTEXT, TAGS)
    policy = eval(form.flax_policy, {"jax": jax})
    saved = [n for n, v in form.maxtext if v == "device" and n != "decoder_layer_input"]
    rebuilt = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved, names_which_can_be_offloaded=[],
        offload_src="device", offload_dst="pinned_host")

    def step(x: jax.Array) -> jax.Array:
        h = checkpoint_name(jax.numpy.sin(x), "context")
        return jax.numpy.sum(checkpoint_name(jax.numpy.cos(h), "mlpwi") * h)

    def kept(p: Any) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_saved_residuals(jax.checkpoint(step, policy=p), 1.0)
        return out.getvalue()

    assert "named 'context'" in kept(policy) and "named 'mlpwi'" not in kept(policy)
    assert kept(policy) == kept(rebuilt)


def test_the_pick_without_a_form_names_the_nearest_measured_one() -> None:
    study = _study(TRIALS)
    found = framework_export(study, None, "maxtext")
    assert found.figures.number == 2 and not found.expressible
    near = found.nearest
    assert near is not None and near.expressible and near.figures.number == 1
    assert (near.figures.total_bytes, near.figures.step_seconds, near.figures.fits) == \
        (300, 1.5, True)
    assert dict(near.form.maxtext)["context"] == "device"
    assert framework_export(study, 1, "flax").nearest is None  # it has a form
    assert framework_export(study, 2, "yaml").expressible  # YAML writes any schedule


def test_when_no_expressible_trial_fits_the_nearest_by_memory() -> None:
    over = [(autoremat.nested([4], "nothing_saveable"), 700, None),
            (SAVE_CONTEXT, 900, None), (TRIALS[2][0], 200, 1.0)]
    near = nearest_expressible(_study(over, budget=500), "maxtext", TAGS)
    assert near is not None and near.figures.number == 0 and not near.figures.fits
    only_nested = [(TRIALS[2][0], 200, 1.0)]
    assert framework_export(_study(only_nested), None, "flax").nearest is None


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A study in a sqlite storage; the flags that name it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    _study(TRIALS, storage=storage, name="stack")
    return ["--storage", storage, "--study-name", "stack"]


def test_cli_prints_the_exact_block(stored: list[str],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "1", "--format", "maxtext", *stored]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "# autoremat: trial 1 of study 'stack': " \
        "4 save_only_these_names(context,mlpwo) unroll=1"
    assert "#   measured: total 300 B, step 1.5 s, budget 1 KB" in out
    block = [line for line in out.splitlines() if not line.startswith("#")]
    assert block == ["remat_policy: custom", "decoder_layer_input: device", "context: device",
                     "mlpwi: remat", "mlpwo: device", "query_proj: remat", "key_proj: remat",
                     "value_proj: remat", "out_proj: remat"]
    assert main(["export", "1", "--format", "flax", "--out", "remat.py", *stored]) == EXIT_OK
    assert capsys.readouterr().out == "wrote remat.py: trial 1, " \
        "4 save_only_these_names(context,mlpwo) unroll=1\n"
    text = Path("remat.py").read_text()
    assert "policy = jax.checkpoint_policies.save_only_these_names('context', 'mlpwo')" in text
    assert "RematBlock = nn.remat(Block, prevent_cse=False, policy=policy)" in text
    assert "forward = nnx.remat(forward, prevent_cse=False, policy=policy)" in text


def test_cli_the_pick_without_a_form_exits_4_or_exports_the_nearest(
        stored: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--format", "maxtext", *stored]) == EXIT_NO_FORM
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("autoremat: trial 2 (2x2 nothing/save_only_these_names("
                                   "context) unroll=1) has no form in MaxText's remat_policy: "
                                   "custom: 2 nested levels remat chunks of layers")
    assert ("the nearest it can write: trial 1, 4 save_only_these_names(context,mlpwo) "
            "unroll=1, total 300 B, step 1.5 s (1.50x trial 2's), within the budget 1 KB "
            "(autoremat export 1 --format maxtext, or add --nearest)") in captured.err
    assert main(["export", "--format", "maxtext", "--nearest", *stored]) == EXIT_OK
    captured = capsys.readouterr()
    assert "exporting trial 1" in captured.err and "mlpwo: device" in captured.out
    # a schedule file: its meta names the study the nearest is looked for in
    schedule = TRIALS[3][0].with_meta(study_name="stack", storage=stored[1], trial=3)
    save_schedule(schedule, "groups.yaml")
    assert main(["export", "groups.yaml", "--format", "flax"]) == EXIT_NO_FORM
    err = capsys.readouterr().err
    assert "trial 3 (groups 2 save_only_these_names(context) + 2 nothing unroll=1)" in err
    assert "different policies; the nearest it can write: trial 1" in err


def test_cli_usage_errors(stored: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "1", *stored]) == EXIT_USAGE  # YAML needs --out
    assert main(["export", "nope.yaml", "--format", "flax", *stored]) == EXIT_USAGE
    assert main(["export", "1", "--format", "toml", *stored]) == EXIT_USAGE
    assert main(["export", "9", "--format", "flax", *stored]) == EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith("autoremat: error: ") for line in lines)
    assert lines[0].startswith("autoremat: error: --out: the YAML export writes a file")
    assert "TRIAL: expected a trial number or a schedule file, got 'nope.yaml'" in lines[1]
    assert "--format" in lines[2] and "maxtext" in lines[2]
    assert lines[3].startswith("autoremat: error: TRIAL: no trial 9 in study 'stack'")
    assert main(["export", "1", "--out", "t.yaml", *stored]) == EXIT_OK  # YAML as before
    assert autoremat.load_schedule("t.yaml").key() == SAVE_CONTEXT.key()


@pytest.mark.slow
def test_keeping_decoder_layer_input_compiles_to_the_same_step() -> None:
    """MaxText never recomputes ``decoder_layer_input``; the block keeps it where the
    schedule did not. It is the layer's input, which remat of each layer keeps anyway:
    the same compiled total either way (a compile of the tiny built-in stack)."""
    from autoremat._measure.measure import measure

    problem = autoremat.layer_stack(layers=2, d_model=32, heads=4, mlp=64, seq_len=8, batch=2)
    names = ["query_proj", "key_proj", "value_proj", "out_proj", "mlpwo"]
    pick = autoremat.nested([2], [{"save_only_these_names": names}])
    form = autoremat.framework_policy(pick, TAGS)
    kept = [n for n, v in form.maxtext if v == "device"]
    assert "decoder_layer_input" in kept and form.notes
    block = autoremat.nested([2], [{"save_only_these_names": kept}])
    totals = [measure(problem, s, run=False).total_bytes for s in (pick, block)]
    assert totals[0] is not None and totals[0] == totals[1]
