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
TAGS = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "attention_out",
        "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
SAVE_ATTENTION = autoremat.nested([4], [{"save_only_these_names": ["attention_out", "mlpwo"]}])
#: (schedule, total bytes, step seconds); the budget is 1000 bytes.
TRIALS: list[tuple[Schedule, int, float | None]] = [
    (autoremat.nested([4], "nothing_saveable"), 100, 2.0),
    (SAVE_ATTENTION, 300, 1.5),
    (autoremat.nested([2, 2], ["nothing_saveable", {"save_only_these_names": ["attention_out"]}]),
     200, 1.0),  # the pick: the fastest that fits, two levels
    (autoremat.groups([(2, {"save_only_these_names": ["attention_out"]}), (2, "nothing_saveable")]),
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
    form = autoremat.framework_policy(SAVE_ATTENTION, TAGS)
    assert form.maxtext_ok and form.flax_ok and form.why_not == ""
    assert form.maxtext == (("decoder_layer_input", "device"), ("mlpwi_0", "remat"),
                            ("mlpwi_1", "remat"), ("mlpwo", "device"), ("query_proj", "remat"),
                            ("key_proj", "remat"), ("value_proj", "remat"),
                            ("out_proj", "remat"), ("attention_out", "device"))
    assert form.unknown == () and form.maxtext_preset == ""
    assert form.flax_policy == ("jax.checkpoint_policies.save_only_these_names("
                                "'attention_out', 'mlpwo')")
    # the pick recomputes decoder_layer_input; MaxText never does, and says so
    assert any("decoder_layer_input" in note for note in form.notes)


def test_maxtext_presets_and_offload_and_unknown_names() -> None:
    qkv = autoremat.framework_policy(autoremat.nested([4], [{"save_only_these_names": [
        "query_proj", "key_proj", "value_proj"]}]), TAGS)
    assert qkv.maxtext_preset == "save_qkv_proj"
    assert autoremat.framework_policy(autoremat.nested([4]), TAGS).maxtext_preset == "full"
    moved = autoremat.framework_policy(
        autoremat.nested([4], offload_names(["attention_out"])), ("attention_out", "mlpwo"))
    assert moved.maxtext == (("mlpwo", "remat"), ("attention_out", "offload"))
    assert moved.flax_policy == (
        "jax.checkpoint_policies.save_and_offload_only_these_names(names_which_can_be_"
        "offloaded=['attention_out'], names_which_can_be_saved=[], offload_dst='pinned_host', "
        "offload_src='device')")
    mine = autoremat.framework_policy(
        autoremat.nested([6], [{"save_only_these_names": ["my_gate"]}]), ("my_gate", "mlpwi"))
    assert mine.maxtext_ok and mine.maxtext == (("mlpwi", "remat"),)
    assert mine.unknown == (("my_gate", "device"),)  # flagged: MaxText cannot save it


def _saving(*names: str) -> Schedule:
    return autoremat.nested([4], [{"save_only_these_names": list(names)}])


def test_a_pick_equal_to_a_maxtext_preset_is_named_as_it() -> None:
    """MaxText's presets list names a model may lack (kv_proj, qkv_proj, mlpwi): a pick
    that does what a preset does to the model's own tags is that preset."""
    qkv = ("query_proj", "key_proj", "value_proj")
    weights = (*qkv, "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
    cases = {
        _saving(*weights): "minimal",
        _saving(*weights, "attention_out"): "",  # no preset saves attention_out
        _saving(*qkv, "out_proj", "mlpwo"): "save_dot_except_mlpwi",
        _saving(*qkv, "out_proj"): "save_dot_except_mlp",
        _saving("out_proj"): "save_out_proj",
        autoremat.nested([4], offload_names(list(qkv))): "qkv_proj_offloaded",
        autoremat.nested([4], offload_names(list(weights))): "minimal_offloaded",
        autoremat.nested([4], offload_names(["query_proj"])): "",
    }
    for schedule, preset in cases.items():
        assert autoremat.framework_policy(schedule, TAGS).maxtext_preset == preset, schedule
    # with a flash kernel's residual tagged, minimal_with_context is the one that saves it
    flash = autoremat.framework_policy(_saving(*weights, "context"), (*TAGS, "context"))
    assert flash.maxtext_preset == "minimal_with_context"


def test_every_maxtext_key_is_known() -> None:
    """MoE, MLA and fused-projection tags are MaxText keys: written, not flagged."""
    tags = ("kv_proj", "qkv_proj", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo", "mla_q",
            "mla_kv", "query_wa_proj", "kv_wa_proj", "attention_out", "mlpwi")
    form = autoremat.framework_policy(_saving("mla_q", "moe_mlpwo"), tags)
    assert form.unknown == () and form.maxtext_ok
    assert dict(form.maxtext) == {**dict.fromkeys(tags, "remat"), "mla_q": "device",
                                  "moe_mlpwo": "device"}


def test_what_maxtext_cannot_say_flax_can() -> None:
    for policy in ("checkpoint_dots_with_no_batch_dims", "none",
                   {"save_anything_except_these_names": ["mlpwi_0"]}):
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

    form = autoremat.framework_policy(SAVE_ATTENTION, TAGS)
    policy = eval(form.flax_policy, {"jax": jax})
    saved = [n for n, v in form.maxtext if v == "device" and n != "decoder_layer_input"]
    rebuilt = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved, names_which_can_be_offloaded=[],
        offload_src="device", offload_dst="pinned_host")

    def step(x: jax.Array) -> jax.Array:
        h = checkpoint_name(jax.numpy.sin(x), "attention_out")
        return jax.numpy.sum(checkpoint_name(jax.numpy.cos(h), "mlpwi_0") * h)

    def kept(p: Any) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_saved_residuals(jax.checkpoint(step, policy=p), 1.0)
        return out.getvalue()

    assert "named 'attention_out'" in kept(policy) and "named 'mlpwi_0'" not in kept(policy)
    assert kept(policy) == kept(rebuilt)


def test_the_pick_without_a_form_names_the_nearest_measured_one() -> None:
    study = _study(TRIALS)
    found = framework_export(study, None, "maxtext")
    assert found.figures.number == 2 and not found.expressible
    near = found.nearest
    assert near is not None and near.expressible and near.figures.number == 1
    assert (near.figures.total_bytes, near.figures.step_seconds, near.figures.fits) == \
        (300, 1.5, True)
    assert dict(near.form.maxtext)["attention_out"] == "device"
    assert framework_export(study, 1, "flax").nearest is None  # it has a form
    assert framework_export(study, 2, "yaml").expressible  # YAML writes any schedule


def test_when_no_expressible_trial_fits_the_nearest_by_memory() -> None:
    over = [(autoremat.nested([4], "nothing_saveable"), 700, None),
            (SAVE_ATTENTION, 900, None), (TRIALS[2][0], 200, 1.0)]
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
        "4 save_only_these_names(attention_out,mlpwo) unroll=1"
    assert "#   measured: total 300 B, step 1.5 s, budget 1 KB" in out
    block = [line for line in out.splitlines() if not line.startswith("#")]
    assert block == ["remat_policy: custom", "decoder_layer_input: device", "mlpwi_0: remat",
                     "mlpwi_1: remat", "mlpwo: device", "query_proj: remat", "key_proj: remat",
                     "value_proj: remat", "out_proj: remat", "attention_out: device"]
    assert main(["export", "1", "--format", "flax", "--out", "remat.py", *stored]) == EXIT_OK
    assert capsys.readouterr().out == "wrote remat.py: trial 1, " \
        "4 save_only_these_names(attention_out,mlpwo) unroll=1\n"
    text = Path("remat.py").read_text()
    assert "policy = jax.checkpoint_policies.save_only_these_names('attention_out', 'mlpwo')" in text
    assert "RematBlock = nn.remat(Block, prevent_cse=False, policy=policy)" in text
    assert "forward = nnx.remat(forward, prevent_cse=False, policy=policy)" in text


def test_cli_the_pick_without_a_form_exits_4_or_exports_the_nearest(
        stored: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--format", "maxtext", *stored]) == EXIT_NO_FORM
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("autoremat: trial 2 (2x2 nothing/save_only_these_names("
                                   "attention_out) unroll=1) has no form in MaxText's remat_policy: "
                                   "custom: 2 nested levels remat chunks of layers")
    assert ("the nearest it can write: trial 1, 4 save_only_these_names(attention_out,mlpwo) "
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
    assert "trial 3 (groups 2 save_only_these_names(attention_out) + 2 nothing unroll=1)" in err
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
    assert autoremat.load_schedule("t.yaml").key() == SAVE_ATTENTION.key()


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


def _recurrence_study(storage: str) -> list[str]:
    """The LSTM quick start's kind of study: a recurrence over 10,000 time steps, its
    readout fused (no tags, not a layer stack); the flags that name it."""
    study = optuna.create_study(directions=["minimize", "minimize"], storage=storage,
                                study_name="lstm")
    for key, value in (("budget_bytes", 10**9), ("seq_len", 10_000), ("layer_stack", False),
                       ("fuse_choice", True)):
        study.set_user_attr(key, value)
    for schedule, total, step in [
            (autoremat.nested([100, 100], ["nothing_saveable", "nothing_saveable"]), 10**8, 1.0),
            (autoremat.nested([10_000], "nothing_saveable"), 2 * 10**8, 1.2)]:
        schedule = schedule.with_fuse(True)
        attrs = {"measured": True, "status": "ok", "feasible": True, "total_bytes": total,
                 "step_seconds": step, "schedule": schedule.to_data(),
                 "schedule_key": schedule.key(), "reason": ""}
        study.add_trial(optuna.trial.create_trial(values=[float(total), step],
                                                  user_attrs=attrs))
    return ["--storage", storage, "--study-name", "lstm"]


def test_a_recurrence_has_no_maxtext_form_and_its_flax_form_speaks_of_time_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    flags = _recurrence_study(f"sqlite:///{tmp_path / 'r.db'}")
    for nearest in ([], ["--nearest"]):  # no empty 'remat_policy: custom', nearest or not
        assert main(["export", "--format", "maxtext", *nearest, *flags]) == EXIT_NO_FORM
        out, err = capsys.readouterr()
        assert out == "" and "remat_policy: custom\n" not in err and err.count("\n") == 1
        assert err.startswith("autoremat: trial 0 (100x100 nothing/nothing unroll=1 fused) has "
                              "no form in MaxText's remat_policy: custom: the study's scan is "
                              "a recurrence over 10,000 time steps, and MaxText's keys name "
                              "the values of a decoder layer"), err
        assert "export --format flax (remat of the cell at each time step)" in err
    # the pick has two levels: Flax says why in the recurrence's words
    assert main(["export", "--format", "flax", *flags]) == EXIT_NO_FORM
    err = capsys.readouterr().err
    assert "2 nested levels remat chunks of time steps (100x100), not each time step alone" \
        in err and "layer" not in err
    assert main(["export", "--format", "flax", "--nearest", *flags]) == EXIT_OK
    out = capsys.readouterr().out
    assert "Block" not in out and "layer" not in out, out
    lines = out.splitlines()
    assert lines[2] == "# a recurrence over 10,000 time steps: remat the cell each time step runs"
    assert "RematCell = nn.remat(Cell, prevent_cse=False, policy=policy)" in lines
    assert lines[-1].startswith("# fuse: true -- measured with the readout and loss inside the "
                                "scanned step")
    # the lines run as written: the imports they use, the policy jax's own
    code = "\n".join(line for line in lines if not line.startswith(("#", "RematCell", "cell_")))
    scope: dict[str, Any] = {}
    exec(code, scope)  # the export's own lines
    import jax

    assert scope["policy"] is jax.checkpoint_policies.nothing_saveable
    assert scope["nn"].remat and scope["nnx"].remat
    # a schedule file whose study is gone: its meta says what its scan runs
    assert main(["export", "1", "--out", "lstm.yaml", *flags]) == EXIT_OK
    assert autoremat.load_schedule("lstm.yaml").meta["layer_stack"] is False
    from autoremat._cli.show_text import describe_schedule

    shown = describe_schedule(autoremat.load_schedule("lstm.yaml"))
    assert "  a recurrence over time steps (not a layer stack: no MaxText form)" in shown
    assert "other meta" not in shown
    (tmp_path / "r.db").unlink()
    capsys.readouterr()
    assert main(["export", "lstm.yaml", "--format", "maxtext"]) == EXIT_NO_FORM
    assert "the study's scan is a recurrence over 10,000 time steps" in capsys.readouterr().err


def test_a_layer_stacks_flax_lines_import_what_they_use(stored: list[str],
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert main(["export", "1", "--format", "flax", *stored]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:5] == ["import jax", "import flax.linen as nn", "from flax import nnx"]
    assert "RematBlock = nn.remat(Block, prevent_cse=False, policy=policy)" in lines


def test_a_tune_result_holds_the_names_framework_policy_takes(stored: list[str]) -> None:
    from autoremat._search.study import summarize

    result = summarize(autoremat.load_study("stack", stored[1]), stored[1])
    assert result.checkpoint_names == TAGS
    form = autoremat.framework_policy(SAVE_ATTENTION, result.checkpoint_names)
    assert dict(form.maxtext)["mlpwi_0"] == "remat"  # a tag the policy does not name is listed


WEIGHTS = ("key_proj", "mlpwi_0", "mlpwi_1", "mlpwo", "out_proj", "query_proj", "value_proj")


def test_a_dots_pick_is_written_by_name_where_the_step_tags_exactly_its_matmuls() -> None:
    """The built-in stack tags every weight matmul's output, and nothing else is one
    without batch dimensions: ``dots_with_no_batch_dims_saveable`` keeps exactly those
    tags (MaxText's ``minimal`` there). ``dots_saveable`` also keeps attention's scores,
    which no tag names: it has no form."""
    from autoremat._models.layer_stack import LayerStack, layer_stack_model
    from autoremat._search.named_policies import step_costs

    model = layer_stack_model(LayerStack(2, 16, 2, 32, 4, 1, vocab=8))
    step, args = model.problem().build(autoremat.plain(2))
    costs = step_costs(step, args, 2)
    assert costs is not None and costs.dot_forms == {
        "dots_with_no_batch_dims_saveable": WEIGHTS}
    for name in ("dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims"):
        form = autoremat.framework_policy(autoremat.nested([4], [name]), TAGS,
                                          costs.dot_forms)
        assert form.maxtext_ok and form.maxtext_preset == "minimal"
        assert {n for n, v in form.maxtext if v == "device"} == {*WEIGHTS, "decoder_layer_input"}
    dots = autoremat.framework_policy(autoremat.nested([4], ["dots_saveable"]), TAGS,
                                      costs.dot_forms)
    assert not dots.maxtext_ok and "keeps values by kind" in dots.maxtext_why_not
    offload = autoremat.framework_policy(
        autoremat.nested([4], [{"offload_dot_with_no_batch_dims": {
            "offload_src": "device", "offload_dst": "pinned_host"}}]), TAGS, costs.dot_forms)
    assert offload.maxtext_ok and offload.maxtext_preset == "minimal_offloaded"


def test_cli_exports_a_dots_pick_the_study_recorded_a_form_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = _study([(autoremat.nested([4], "dots_with_no_batch_dims_saveable"), 100, 1.0)],
                   storage=storage)
    study.set_user_attr("dot_forms", {"dots_with_no_batch_dims_saveable": list(WEIGHTS)})
    assert main(["export", "0", "--format", "maxtext", "--storage", storage,
                 "--study-name", "s"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "mlpwi_0: device" in out and "attention_out: remat" in out
    assert "# the same as MaxText's remat_policy: minimal over these names" in out


@pytest.mark.slow
def test_the_dots_picks_named_form_compiles_to_the_same_total() -> None:
    """``dots_with_no_batch_dims_saveable`` and ``save_only_these_names`` of the tags it
    keeps exactly (``dot_forms``): the same compiled total on the built-in stack."""
    from autoremat._measure.measure import measure

    problem = autoremat.layer_stack(layers=2, d_model=32, heads=4, mlp=64, seq_len=8, batch=2)
    named = autoremat.nested([2], [{"save_only_these_names": list(WEIGHTS)}])
    totals = [measure(problem, s, run=False).total_bytes
              for s in (autoremat.nested([2], ["dots_with_no_batch_dims_saveable"]), named)]
    assert totals[0] is not None and totals[0] == totals[1]


def test_the_maxtext_block_says_what_context_and_unread_names_are() -> None:
    from autoremat._cli.export_text import maxtext_lines
    from autoremat._search.export_forms import schedule_export

    found = schedule_export(_saving("context", "my_gate"), "maxtext")
    text = "\n".join(maxtext_lines(found))
    assert "context: device" in text and "flash kernels' saved residuals" in text
    assert "names MaxText's custom policy does not read (MaxText 0.2.5; it recomputes " \
        "them): my_gate (the schedule: saved)" in text
