"""Risky choices (offload, unroll) checked on the problem before a study offers them.

``probe`` runs the checks and types their verdicts; ``guard`` probes each choice and
combination when the planner first proposes it and records the verdicts in the study;
``cache`` keeps them beside the storage for the next study.
"""
