"""Which schedule a worker measures next: the planner and the parts it holds.

Read ``planner`` first: ``Planner`` composes the others, each readable alone --
``pool`` (the candidates, in the search space), ``standings`` (what was timed, the
best, the patience left), ``judge`` (the time and memory models' view of a candidate:
predicted time, bytes, the stop rule; ``untimed``: its pure rules), ``screening`` (the
one order of the rules: a candidate's next action from its facts), ``clock`` (the time
left, a compile's cost by its unroll), ``ahead`` (compiles ahead on ``compile_pool``'s
threads), ``offload_twins`` and ``presets`` (a layer stack's presets first;
``layer_costs``: what its schedules keep). ``predict`` and ``memory_model`` are the two
models, ``candidates`` the pool's entries, ``short_scans`` every structure of a short
scan.
"""
