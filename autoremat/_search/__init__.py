"""The search: a schedule that fits a budget, found by measuring, as an Optuna study.

``tune`` runs it (on every process of a multi-controller job: ``lockstep``): the space
of schedules (``space``; ``named_policies``: policies over a
step's own checkpoint names; ``short_scans``: the short heavy scans; ``presets``: a layer
stack's presets, tried first, and ``layer_costs``: what its schedules keep), the cost
models (``predict``: step time; ``memory_model``: compiled bytes) and the ``planner``
(its pool's ``candidates``, its compiles ahead: ``planner_ahead`` on ``compile_pool``'s
threads; an offload's twin without the copies first: ``offload_twins``; what keeps a
sized one untimed: ``untimed``; one set of arguments for steps alike: ``arguments``)
choose what to measure next; a
``worker`` measures it (and before it stops runs the leader in turn with its closest
challengers: ``retime``); long scans are timed on short runs (``short_runs``) and the pick
at full length (``confirm``); risky choices are checked when first proposed (``probe``,
``probe_guard``, their verdicts kept by ``probe_cache``) and the pick is proved to fit
(``proof``). The study: its storage and lock (``storage``), opened or resumed
(``resume``), read (``study``; the last one tuned from a folder: ``last_study``), the
names written into it (``attrs``), its Pareto front, as data (``pareto``; its table and
plot are ``autoremat._cli``'s) and its answer in the user's framework (``export_forms``).
"""
