"""The problem a command runs on: a built-in model, looked up by name in the registry
(``autoremat._models.MODELS``) and built from the settings given, or the user's
``--problem module:name``; a setting that sizes another problem is refused by its flag."""

from __future__ import annotations

from autoremat._cli.settings import PROBLEM_SETTINGS, ProblemSettings, UsageError, flag
from autoremat._errors import AutorematError, did_you_mean
from autoremat._measure.problem import Problem, resolve_problem
from autoremat._models import MODELS, Model, model


def make_problem(settings: ProblemSettings) -> Problem:
    """The built-in model ``settings.problem`` names (the default one for ``None``), built
    from the settings given, or the user's problem it names (which takes none of them).

    Raises:
      UsageError: a name that is neither built in nor ``module:name``/``file.py:name``
        (listing the built-in names), or a setting the problem does not take, naming its
        flag and what it sizes.
    """
    found = model(settings.problem)
    given = dict(settings.given)
    if found is None:
        ref = settings.problem
        assert ref is not None  # no name is the default, a built-in model
        if ":" not in ref:
            raise UsageError(f"--problem: {ref!r} is neither a built-in problem ("
                             f"{', '.join(MODELS)}) nor your own as 'package.module:name' or "
                             f"'path/to/file.py:name'{did_you_mean(ref, MODELS)}")
        if given:
            raise UsageError(f"{settings.flag(next(iter(given)))}: only resizes the built-in "
                             f"problems ({', '.join(MODELS)}); your --problem sets its own "
                             "sizes")
        return resolve_problem(ref)
    others = [name for name in given if name not in found.settings]
    if others:
        raise UsageError(_not_taken(settings, others[0], found))
    try:
        return found.build(**found.arguments(given))
    except AutorematError as e:  # a size the builder refuses, named by its argument
        name, sep, rest = str(e).partition(": ")
        if sep and name in found.settings:
            shown = settings.flag(name) if name in given else flag(name)
            for s in PROBLEM_SETTINGS:  # "seq2seq=False" is the flag that stores it
                if s.const is not None:
                    rest = rest.replace(f"{s.name}={s.const!r}", s.flag)
            raise UsageError(f"{shown}: {rest}") from e
        raise


def _not_taken(settings: ProblemSettings, name: str, found: Model) -> str:
    """The message for setting ``name``, given for built-in model ``found``, which does not
    take it: which models it sizes, and how to pick one."""
    takers = [m.name for m in MODELS.values() if name in m.settings]
    if settings.problem is None and len(takers) == 1:
        return (f"{settings.flag(name)}: sizes the built-in {takers[0]} only; add "
                f"--problem {takers[0]}")
    return (f"{settings.flag(name)}: sizes the built-in {' and '.join(takers)} only; {found.name} takes "
            + " ".join(flag(n) for n in found.settings))
