"""The command's own parts: settings (flags and ``autoremat.yaml``) and printing;
``export_command``: the ``export`` command; ``export_text``: what it prints for MaxText and
Flax; ``show_command``: the ``show`` command (with a problem, its compiled total beside the
tuned one)."""
