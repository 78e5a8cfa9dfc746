"""The search: a schedule that fits a budget, found by measuring, as an Optuna study.

``tune`` runs it (on every process of a multi-controller job: ``lockstep``), first
measuring what scheduling can save at most (``bound``): the space
of schedules (``space``; ``named_policies``: policies over a step's own checkpoint
names), the cost models and the planner (``planning``: its pool, standings, judge,
compiles ahead, offload twins and a layer stack's presets; one set of arguments for
steps alike: ``arguments``) choose what to measure next; a ``worker`` measures it (and
before it stops runs the leader in turn with its closest challengers: ``retime``); long
scans are timed on short runs (``short_runs``) and the pick at full length
(``confirm``); risky choices are checked when first proposed (``probes``) and the pick
is proved to fit (``proof``); what ``tune`` reports while it runs, and the proof's
outcome, are records (``reports``) the command line words. The study: its storage and
lock (``storage``), opened or resumed (``resume``), read (``study``; its measured
trials and the answer among them: ``trials``; the last one tuned from a folder:
``last_study``), the names written into it (``attrs``; each trial's
schedule as Optuna params: ``trial_params``), what ``tune`` logs as it goes
(``tune_log``), its Pareto front, as data (``pareto``; its table and plot are
``autoremat._cli``'s) and its answer in the user's framework (``export_forms``). Apart
from the study: a MaxText model tuned by its own remat knobs, each measured as MaxText's
train step (``maxtext_knobs``).
"""
