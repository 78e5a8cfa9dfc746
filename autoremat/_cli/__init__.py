"""The command's own parts: ``settings`` (its options and study-file keys, in one table, and
the typed records read from it) and
``printing`` (what tune prints); ``breakdown_text`` (the memory breakdown and the floor in
words), ``front_text`` (the front's table and JSON), ``plot`` (the front drawn, for
``pareto --plot`` and ``autoremat.plot_front``), ``show_text`` (what show prints of a
schedule); ``problems`` (the problem a command runs on: a built-in model from
``autoremat._models.MODELS``, or the user's); ``exits``: the exit codes' table and how an
error or a crash is reported;
``tune_command``, ``pareto_command``, ``export_command``, ``show_command``,
``maxtext_command``: those commands (``tune_command`` reads its settings as one
``TuneSettings``);
``export_text``: what export prints for MaxText and Flax; ``distributed``: ``tune
--coordinator``, joining a multi-controller job."""
