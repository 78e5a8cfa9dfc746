"""``autoremat maxtext``: a MaxText model tuned by its own remat knobs; the table of what was
measured and the pick as MaxText config lines (the parser is ``autoremat.cli``'s)."""

from __future__ import annotations

import argparse
import json
import sys

from autoremat._atomic import atomic_write_text
from autoremat._cli.exits import EXIT_NOTHING_FITS
from autoremat._cli.settings import UsageError
from autoremat._units import format_bytes, format_seconds, parse_bytes


def run_maxtext(args: argparse.Namespace) -> int:
    """Tune the MaxText model of ``args.overrides`` (``key=value``) within ``--budget``;
    print each knob setting as it is measured, then the pick's config lines (written
    atomically to ``--out`` as YAML, with ``--json`` the whole tune as JSON)."""
    from autoremat._models.maxtext import maxtext_available, maxtext_model
    from autoremat._search.maxtext_knobs import Tried, as_data, config_lines, tune_maxtext

    bad = [o for o in args.overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise UsageError(f"OVERRIDE: expected MaxText's key=value, got {bad[0]!r} "
                         "(e.g. base_num_decoder_layers=4)")
    if not maxtext_available():
        raise UsageError("maxtext: MaxText is not installed here; on Python >= 3.12, "
                         "pip install 'autoremat[maxtext]'")
    budget = parse_bytes(args.budget)
    print(f"building the MaxText model ({' '.join(args.overrides) or 'base.yml'}) ...",
          flush=True)
    model = maxtext_model(args.overrides, args.config)
    print(f"{model.layers} layers, scan_layers={str(model.scan_layers).lower()}; tags: "
          f"{', '.join(model.tags) or 'none'}", flush=True)

    def show(t: Tried) -> None:
        m = t.measurement
        figures = (f"total {format_bytes(m.total_bytes)}, step {format_seconds(m.step_seconds)}"
                   if m.step_seconds is not None else m.reason or m.status)
        print(f"  {t.knob.label:<40} {figures}", flush=True)

    print(f"budget: {format_bytes(budget)}; measuring MaxText's train step under each "
          "knob setting:", flush=True)
    result = tune_maxtext(model, budget, limit=args.limit, on_tried=show)
    if args.json:
        print(json.dumps(as_data(result), indent=1))
    if result.pick is None:
        print(f"autoremat: no knob setting fits {format_bytes(budget)}", file=sys.stderr)
        return EXIT_NOTHING_FITS
    lines = config_lines(result.pick.knob)
    m = result.pick.measurement
    head = (f"# autoremat maxtext: {result.pick.knob.label}: total "
            f"{format_bytes(m.total_bytes)}, step {format_seconds(m.step_seconds)}, budget "
            f"{format_bytes(budget)}")
    text = "\n".join([head, *lines]) + "\n"
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {args.out}: {result.pick.knob.label}")
    else:
        print(text, end="")
    return 0
