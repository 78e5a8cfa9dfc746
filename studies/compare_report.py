"""The rows of ``studies/compare.py``: checked against the plain row, shown as tables,
slopes, ratios, a plot and the generated section of ``docs/benchmarks.md``.

Reads and writes ``compare.json`` (``Row``s as mappings); imports no jax, so
``compare.py --render`` re-renders a saved run without measuring anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

AUTOREMAT = "autoremat"  # rows whose method starts with this are ours (ratio tables)
PLAIN = "plain"
MIN_MEMORY = "autoremat min-memory"
FUSED = "autoremat fused"  # rows of the fused-readout step (compare.py --fused-readout)
FUSED_PLAIN = "plain (fused readout)"
FUSED_MIN_MEMORY = f"{FUSED} min-memory"
FUSED_TUNED = f"{FUSED} tuned <=1% temp"
FUSED_TEMP, FUSED_TIME = 0.01, 1.1  # issue 13: temp <= 1% of plain's, step <= 1.1x plain's
RTOL = 1e-5  # loss vs the plain scan's
GRAD_RTOL = 1e-4  # max |g - g_plain| / max |g_plain|, per leaf
PAGE = Path("docs/benchmarks.md")  # where ``compare.py --render ... --readme`` writes the tables
PAGE_BEGIN = "<!-- studies/compare.py --readme: begin (generated, do not edit) -->"
PAGE_END = "<!-- studies/compare.py --readme: end -->"

Walls = Sequence[tuple[int, bool, float]]  # (T, seq2seq, wall seconds) per group


@dataclass
class Row:
    """One measured method at one (T, seq2seq)."""

    seq_len: int
    seq2seq: bool
    method: str
    detail: str = ""
    total_bytes: int | None = None
    temp_bytes: int | None = None
    step_seconds: float | None = None
    ratio: float | None = None
    compile_seconds: float | None = None
    loss: float | None = None
    loss_matches: bool | None = None
    grad_error: float | None = None
    grads_match: bool | None = None
    peak_bytes: int | None = None  # GPU: the row's process peak (peak_bytes_in_use)
    runtime_peak_bytes: int | None = None  # GPU: the step's own runtime peak, isolated
    compile_scratch_bytes: int | None = None  # GPU: transient memory compiling it took
    error: str = ""


@dataclass
class Outcome:
    """A measured row and its gradients (for the check against the plain scan)."""

    row: Row
    grads: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Slope:
    """A fitted log-log slope of bytes vs T for one method and loss kind."""

    method: str
    seq2seq: bool
    measure: str  # "total" or "temp"
    seq_lens: tuple[int, ...]
    slope: float | None


def grad_error(grads: Sequence[Any], reference: Sequence[Any]) -> float:
    """Largest per-leaf max-norm relative difference; ``inf`` if the trees differ."""
    import numpy as np

    if len(grads) != len(reference) or not reference:
        return math.inf
    worst = 0.0
    for a, b in zip(grads, reference, strict=True):
        if a.shape != b.shape:
            return math.inf
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        diff = float(np.max(np.abs(a - b))) if b.size else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def check_against_plain(outcomes: Sequence[Outcome]) -> list[Row]:
    """Step-time ratio, loss match and gradient match of every row against the group's plain row."""
    rows = [o.row for o in outcomes]
    plain = next((o for o in outcomes if o.row.method == PLAIN), None)
    if plain is None:
        return rows
    for o in outcomes:
        r = o.row
        if r.step_seconds is not None and plain.row.step_seconds:
            r.ratio = r.step_seconds / plain.row.step_seconds
        if r.loss is not None and plain.row.loss is not None:
            r.loss_matches = abs(r.loss - plain.row.loss) <= RTOL * abs(plain.row.loss)
        if o.grads and plain.grads:
            r.grad_error = grad_error(o.grads, plain.grads)
            r.grads_match = r.grad_error <= GRAD_RTOL
    if plain.row.step_seconds:
        plain.row.ratio = 1.0
    return rows


def megabytes(b: int | None) -> str:
    return "-" if b is None else f"{b / 1e6:,.2f} MB"


def seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f} s"


def _kind(seq2seq: bool) -> str:
    return "all steps" if seq2seq else "last"


def _md(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A markdown table."""
    rows = ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows])


GPU_COLUMNS = ("runtime peak", "compile scratch", "process peak")  # after total, with ``gpu``


def _device(r: Row) -> list[str]:
    """The ``GPU_COLUMNS`` cells of ``r`` (``n/a``: not measured, e.g. no memory stats)."""
    return ["n/a" if b is None else megabytes(b)
            for b in (r.runtime_peak_bytes, r.compile_scratch_bytes, r.peak_bytes)]


def table(rows: Sequence[Row], gpu: bool = False) -> str:
    """A markdown table of ``rows``; with ``gpu`` the device figures follow the estimate (total)."""
    ok = {True: "yes", False: "NO", None: "-"}
    head = ["T", "loss on", "method", "schedule", "total", *(GPU_COLUMNS if gpu else ()), "temp",
            "step", "vs plain", "compile", "loss ok", "grads ok"]
    body = [[f"{r.seq_len:,}", _kind(r.seq2seq), r.method,
             (r.detail or "") + (f" ERROR {r.error[:80]}" if r.error else ""),
             megabytes(r.total_bytes), *(_device(r) if gpu else ()), megabytes(r.temp_bytes),
             seconds(r.step_seconds), "-" if r.ratio is None else f"{r.ratio:.2f}",
             seconds(r.compile_seconds), ok[r.loss_matches], ok[r.grads_match]]
            for r in rows]
    return _md(head, body)


def _fit(points: Sequence[tuple[int, float]]) -> float | None:
    import numpy as np

    if len({t for t, _ in points}) < 2:
        return None
    return float(np.polyfit(np.log10([p[0] for p in points]), np.log10([p[1] for p in points]), 1)[0])


def slopes(rows: Sequence[Row], methods: Sequence[str] | None = None) -> list[Slope]:
    """Log-log slopes of total and temp bytes vs T per (method, loss kind), over all measured T."""
    measures: list[tuple[str, Callable[[Row], int | None]]] = [
        ("total", lambda r: r.total_bytes), ("temp", lambda r: r.temp_bytes)]
    out = []
    for method in methods if methods is not None else dict.fromkeys(r.method for r in rows):
        for seq2seq in (False, True):
            mine = sorted((r for r in rows if r.method == method and r.seq2seq == seq2seq),
                          key=lambda r: r.seq_len)
            if not mine:
                continue
            for name, get in measures:
                pts = [(r.seq_len, float(b)) for r in mine if (b := get(r)) is not None and b > 0]
                out.append(Slope(method, seq2seq, name, tuple(t for t, _ in pts), _fit(pts)))
    return out


def slope_table(fitted: Sequence[Slope]) -> str:
    """Markdown: one line per (method, loss kind), a column per measure."""
    body = []
    for method, seq2seq in dict.fromkeys((s.method, s.seq2seq) for s in fitted):
        mine = {s.measure: s for s in fitted if (s.method, s.seq2seq) == (method, seq2seq)}
        points = mine["total"].seq_lens if "total" in mine else ()
        slope = [mine[m].slope if m in mine else None for m in ("total", "temp")]
        body.append([method, _kind(seq2seq), ", ".join(f"{t:,}" for t in points) or "-",
                     *("-" if v is None else f"{v:.2f}" for v in slope)])
    return _md(["method", "loss on", "T points", "slope total", "slope temp"], body)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def competitor_ratios(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """For each group and competitor, each autoremat row's memory and step-time ratio against it.

    A ratio below 1 means the autoremat row uses less memory / is faster.
    """
    out = []
    for group in dict.fromkeys((r.seq_len, r.seq2seq) for r in rows):
        mine = [r for r in rows if (r.seq_len, r.seq2seq) == group]
        ours = [r for r in mine if r.method.startswith(AUTOREMAT)]
        for comp in (r for r in mine if not r.method.startswith(AUTOREMAT)):
            out += [{"seq_len": group[0], "seq2seq": group[1], "competitor": comp.method,
                     "ours": a.method, "total_ratio": _ratio(a.total_bytes, comp.total_bytes),
                     "temp_ratio": _ratio(a.temp_bytes, comp.temp_bytes),
                     "time_ratio": _ratio(a.step_seconds, comp.step_seconds)} for a in ours]
    return out


def ratio_table(ratios: Sequence[dict[str, Any]]) -> str:
    """Markdown: one line per (T, loss kind, competitor), columns per autoremat row."""
    ours = list(dict.fromkeys(r["ours"] for r in ratios))
    head = ["T", "loss on", "competitor"]
    for name in ours:
        short = name.removeprefix(AUTOREMAT).strip()
        head += [f"{short}: memory total / temp", f"{short}: step time"]

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.3f}x"

    by = {(r["seq_len"], r["seq2seq"], r["competitor"], r["ours"]): r for r in ratios}
    body = []
    for seq_len, seq2seq, comp in dict.fromkeys((r["seq_len"], r["seq2seq"], r["competitor"])
                                                for r in ratios):
        cells = [f"{seq_len:,}", _kind(seq2seq), comp]
        for name in ours:
            r = by.get((seq_len, seq2seq, comp, name))
            cells += ["-", "-"] if r is None else [f"{x(r['total_ratio'])} / {x(r['temp_ratio'])}",
                                                   x(r["time_ratio"])]
        body.append(cells)
    return _md(head, body)


def fused_check(rows: Sequence[Row], heading: str = "##") -> list[str]:
    """Markdown: per group with fused rows, the fastest fused autoremat row whose temp is
    <= 1% of the plain (unfused) row's, against that plain row (empty: no fused rows)."""
    body = []
    for group in dict.fromkeys((r.seq_len, r.seq2seq) for r in rows):
        mine = [r for r in rows if (r.seq_len, r.seq2seq) == group]
        plain = next((r for r in mine if r.method == PLAIN), None)
        fused = [r for r in mine if r.method.startswith(FUSED) and not r.error
                 and r.temp_bytes is not None and r.step_seconds is not None]
        if plain is None or not fused or not plain.temp_bytes or not plain.step_seconds:
            continue
        small = [r for r in fused if (r.temp_bytes or 0) <= FUSED_TEMP * plain.temp_bytes]
        best = (min(small, key=lambda r: r.step_seconds or math.inf) if small
                else min(fused, key=lambda r: r.temp_bytes or 0))
        temp = (best.temp_bytes or 0) / plain.temp_bytes
        time = (best.step_seconds or 0) / plain.step_seconds
        ok = temp <= FUSED_TEMP and time <= FUSED_TIME
        body.append([f"{group[0]:,}", best.method, best.detail, megabytes(best.temp_bytes),
                     megabytes(plain.temp_bytes), f"{100 * temp:.2f}%", f"{time:.2f}x",
                     {True: "yes", False: "NO", None: "-"}[best.loss_matches and best.grads_match],
                     "yes" if ok else "NO"])
    if not body:
        return []
    return [f"{heading} The readout inside the step: fused rows against the plain (unfused) scan", "",
            "The fastest fused-readout autoremat row whose temp is <= 1% of the plain unfused "
            "scan's (else the smallest), measured in the same run as that plain row.", "",
            _md(["T", "fused row", "schedule", "temp", "plain temp", "temp / plain",
                 "step / plain", "loss+grads ok", "<= 1% temp and <= 1.1x step"], body), ""]


def plot(rows: Sequence[Row], fitted: Sequence[Slope], path: Path) -> None:
    """Log-log total and temp bytes vs T for plain and min-memory autoremat, slopes in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, measure in zip(axes, ("total", "temp"), strict=True):
        for s in fitted:
            if (s.method not in (PLAIN, MIN_MEMORY, FUSED_MIN_MEMORY) or s.measure != measure
                    or not s.seq_lens):
                continue
            pts = sorted((r.seq_len, getattr(r, f"{measure}_bytes")) for r in rows
                         if (r.method, r.seq2seq) == (s.method, s.seq2seq) and r.seq_len in s.seq_lens)
            label = f"{s.method}, {'seq2seq' if s.seq2seq else 'last'}"
            label += f" (slope {s.slope:.2f})" if s.slope is not None else ""
            ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], "--" if s.seq2seq else "-",
                    marker="o" if s.method == PLAIN else "s", label=label)
        ax.set(xscale="log", yscale="log", xlabel="sequence length T",
               ylabel=f"{measure} bytes (memory_analysis), MB",
               title=f"seed LSTM train step: {measure} memory vs T")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _commands_md(command: str | Sequence[str]) -> list[str]:
    commands = [command] if isinstance(command, str) else list(command)
    if len(commands) == 1:
        return [f"Command: `{commands[0]}`", ""]
    return ["Commands (a later one's rows replace the same T and loss of an earlier one's):", "",
            *[f"- `{c}`" for c in commands], ""]


def report(rows: Sequence[Row], fitted: Sequence[Slope], gpu: bool, command: str | Sequence[str],
           walls: Walls, isolate: bool, where: str) -> str:
    """The markdown written to ``compare.md`` (``where``: the machine line)."""
    lines = [
        "# seed LSTM: side-by-side remat comparison", "",
        f"Measured on: {where}.", "",
        *_commands_md(command),
        "Rows of one (T, loss on) run in the same process one after another"
        + (" (each row in a fresh subprocess, for the process peak)" if isolate else "")
        + "; `vs plain` is the step-time ratio to that group's plain scan. total = argument + output "
        "+ temp - alias of the compiled step (`memory_analysis()`); step = median of the timed runs "
        "after one warm-up; loss ok: the warm-up loss equals plain's (rtol 1e-5); grads ok: Adam's "
        "first moment (0.1 x gradient) equals plain's (max-norm relative error <= 1e-4)"
        + ("; total is the compiled estimate; runtime peak: the step's own peak while it ran "
           "(its arguments plus what its warm-up raised the device's mark above what was live, "
           "isolated from compiling and earlier work); compile scratch: the transient device "
           "memory compiling it took, freed before it runs; process peak: "
           "`memory_stats()['peak_bytes_in_use']` of the row's process (n/a where the backend has "
           "no memory stats or the figure could not be isolated)" if gpu else "")
        + ". Memory figures are exact "
        "and reproducible; step times are wall-clock medians on the machine as it was (on a shared "
        "CPU they move by tens of percent between runs), so compare rows of one group.", "",
        table(rows, gpu), "",
        "## Memory vs T: log-log slopes", "",
        "Fitted over every measured T. total includes the input x (T * B * 32 float32), linear for "
        "every method; temp is what remat changes. With the loss on all steps the step itself "
        "keeps per-step arrays (the (T, B, H) hidden states the readout reads, the (B, T, 4) "
        "predictions and their gradients), so every method is linear there too.", "",
        slope_table(fitted), "",
        "![memory vs T](memory_vs_T.png)", "",
        "## autoremat against each competitor", "",
        "autoremat's rows divided by the competitor's, same T and loss (below 1: less memory / faster).",
        "",
        ratio_table(competitor_ratios(rows)), "",
        *fused_check(rows),
    ]
    if walls:
        lines += ["## Wall time", "", "| T | loss on | wall (plan + all rows) |", "|---|---|---|"]
        lines += [f"| {t:,} | {_kind(s)} | {w:.0f} s |" for t, s, w in walls]
        lines += ["", f"Total: {sum(w for _, _, w in walls):.0f} s.", ""]
    return "\n".join(lines)


def write_outputs(out: Path, rows: Sequence[Row], gpu: bool, command: str | Sequence[str],
                  walls: Walls, isolate: bool, batch: int, hidden: int, where: str) -> list[Slope]:
    """compare.md, compare.json and memory_vs_T.png; returns the slopes."""
    fitted = slopes(rows)
    plot(rows, fitted, out / "memory_vs_T.png")
    (out / "compare.md").write_text(report(rows, fitted, gpu, command, walls, isolate, where))
    commands = [command] if isinstance(command, str) else list(command)
    data = {"commands": commands, "machine": where, "gpu": gpu, "isolate": isolate, "batch": batch,
            "hidden": hidden, "rows": [asdict(r) for r in rows], "slopes": [asdict(s) for s in fitted],
            "ratios": competitor_ratios(rows),
            "walls": [{"seq_len": t, "seq2seq": s, "seconds": w} for t, s, w in walls]}
    (out / "compare.json").write_text(json.dumps(data, indent=1, default=str))
    return fitted


def page_section(data: dict[str, Any]) -> str:
    """What goes between the page's markers: machine, commands, the table and the slopes."""
    rows = [Row(**r) for r in data["rows"]]
    total = sum(w["seconds"] for w in data.get("walls", []))
    walls = ", ".join(f"T={w['seq_len']:,} {_kind(w['seq2seq'])} {w['seconds']:.0f} s"
                      for w in data.get("walls", []))
    return "\n".join([
        f"Measured on: {data['machine']}.", "",
        "<!-- not run: the measurements behind the tables below (about an hour on 2 CPU cores) -->",
        "```bash", *_saved_commands(data), "```", "",
        f"Wall time {total / 60:.0f} min ({walls}).", "",
        table(rows, data.get("gpu", False)), "",
        slope_table([s for s in slopes(rows) if s.method in (PLAIN, MIN_MEMORY, FUSED_MIN_MEMORY)]),
        "", *fused_check(rows, "##"),
    ])


def _saved_commands(data: dict[str, Any]) -> list[str]:
    return list(data.get("commands") or [data["command"]])


def merged(previous: dict[str, Any], rows: Sequence[Row], walls: Walls,
           command: str) -> tuple[list[Row], list[tuple[int, bool, float]], list[str]]:
    """This run's rows plus a saved run's rows of the (T, loss) groups this run did not measure."""
    mine = {(r.seq_len, r.seq2seq) for r in rows}
    old = [Row(**r) for r in previous["rows"] if (r["seq_len"], r["seq2seq"]) not in mine]
    old_walls = [(w["seq_len"], w["seq2seq"], w["seconds"]) for w in previous.get("walls", [])
                 if (w["seq_len"], w["seq2seq"]) not in mine]
    all_rows = sorted([*old, *rows], key=lambda r: (r.seq_len, r.seq2seq))  # stable: method order kept
    all_walls = sorted([*old_walls, *walls], key=lambda w: (w[0], w[1]))
    return all_rows, all_walls, [*_saved_commands(previous), command] if old else [command]


def update_page(page: Path, json_path: Path) -> None:
    """Replace the text between ``PAGE_BEGIN`` and ``PAGE_END`` in ``page`` (``docs/benchmarks.md``);
    a page that does not exist yet is written with a title and the section."""
    text = page.read_text() if page.exists() else f"# Benchmarks\n\n{PAGE_BEGIN}\n{PAGE_END}\n"
    if PAGE_BEGIN not in text or PAGE_END not in text:
        raise SystemExit(f"{page}: no {PAGE_BEGIN!r} ... {PAGE_END!r} markers")
    head, rest = text.split(PAGE_BEGIN, 1)
    _, tail = rest.split(PAGE_END, 1)
    body = page_section(json.loads(json_path.read_text()))
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"{head}{PAGE_BEGIN}\n{body}{PAGE_END}{tail}")


def render(json_path: Path, out: Path) -> list[Row]:
    """Rewrite compare.md/.json and the PNG from a saved compare.json (no measuring)."""
    data = json.loads(Path(json_path).read_text())
    rows = [Row(**r) for r in data["rows"]]
    walls = [(w["seq_len"], w["seq2seq"], w["seconds"]) for w in data.get("walls", [])]
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, rows, data.get("gpu", False), _saved_commands(data), walls,
                  data.get("isolate", False), data.get("batch", 10), data.get("hidden", 128),
                  data["machine"])
    return rows
