"""The search: a schedule that fits a budget, found by measuring, as an Optuna study.

``tune`` runs it: the space of schedules (``space``; ``names``: policies over a step's
own checkpoint names; ``short_scans``: the short heavy scans), the cost model
(``predict``) and the ``planner`` choose what to measure next; a ``worker`` measures it;
long scans are timed on short runs (``short_runs``) and the pick at full length
(``confirm``); risky choices are checked first (``probe``) and the pick is proved to fit
(``proof``). The study: its storage and lock (``storage``), opened or resumed
(``resume``), read (``study``), the names written into it (``attrs``), and its Pareto
front (``pareto``).
"""
