"""The command's own parts: settings (flags and ``autoremat.yaml``) and printing."""
