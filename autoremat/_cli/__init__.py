"""The command's own parts: ``settings`` (its options and study-file keys, in one table) and
``printing`` (what tune prints); ``exits``: the exit codes' table and how an error or a crash
is reported; ``pareto_command``, ``export_command``, ``show_command``: those commands;
``export_text``: what export prints for MaxText and Flax; ``distributed``: ``tune
--coordinator``, joining a multi-controller job."""
