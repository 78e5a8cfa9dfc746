"""The command's own parts: settings (flags and ``autoremat.yaml``) and printing;
``export_text``: what ``export`` prints for MaxText and Flax."""
