"""The search: the space of schedules, the cost model, the planner, short runs at long T,
the Optuna study (storage, resume), the confirmation of the pick and the Pareto front."""
