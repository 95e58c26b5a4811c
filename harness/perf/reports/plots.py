"""PNG plots of a benchmark JSON (matplotlib with the Agg backend, imported only here and lazily).

* ``tflops_vs_seqlen.png``: TFLOP/s against sequence length, one line per backend, one panel per
  sweep (head dim x causal x ...) and mode;
* ``bars_<mode>.png``: grouped bars like the FA papers: per sweep, one group per sequence length,
  one bar per backend; OOM cells are marked "OOM" at the bar's place;
* ``memory_vs_seqlen.png``: peak MiB against sequence length per backend, one panel per sweep.

Only plain measurements are drawn: flagged (implausible), failed or unsupported cells are not.
"""

from __future__ import annotations

from pathlib import Path

from harness.perf.reports import group_of

MODES = ("fwd", "bwd", "fwd+bwd")
#: Panel size in inches.
PANEL_W, PANEL_H = 5.0, 3.6


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _series(data: dict, value):
    """{sweep label: {backend: {seqlen: value}}} over results with a sequence-length axis."""
    out: dict[str, dict[str, dict[int, object]]] = {}
    for rec in data["results"]:
        label, s = group_of(rec)
        if s is None:
            continue
        v = value(rec)
        if v is not None:
            out.setdefault(label, {}).setdefault(rec["backend"], {})[s] = v
    return out


def _tflops(mode):
    def get(rec):
        c = rec.get("modes", {}).get(mode)
        if c and c.get("status") == "ok":
            return None if c.get("launch_bound") else c["tflops"]  # a launch-bound rate is not the kernel's
        return "OOM" if c and c.get("status") == "oom" else None
    return get


def _colors(data: dict) -> dict[str, str]:
    """One colour per backend, the same in every panel and figure."""
    names = sorted({rec["backend"] for rec in data["results"]})
    return {b: f"C{i % 10}" for i, b in enumerate(names)}


def _seqlen_axis(ax, xs) -> None:
    ax.set_xscale("log", base=2)
    xs = sorted(set(xs))
    if xs:
        ax.set_xticks(xs, [f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x) for x in xs])
        ax.minorticks_off()


def _grid(plt, n_rows: int, n_cols: int):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(PANEL_W * n_cols, PANEL_H * n_rows), squeeze=False)
    return fig, axes


def _save(fig, path: Path, title: str) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _title_suffix(data: dict) -> str:
    dev = (data.get("device") or {}).get("name", "")
    host = (data.get("settings") or {}).get("clock") == "host"
    return f"{dev}" + (" (HOST TIME, not device time)" if host else "")


def plot_lines(data: dict, out: Path, modes) -> Path | None:
    per_mode = {m: _series(data, _tflops(m)) for m in modes}
    labels = sorted({lab for m in modes for lab, s in per_mode[m].items()
                     if any(isinstance(v, float) for b in s.values() for v in b.values())})
    if not labels:
        return None
    plt = _plt()
    colors = _colors(data)
    fig, axes = _grid(plt, len(labels), len(modes))
    for i, lab in enumerate(labels):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            seen = []
            for backend, pts in sorted(per_mode[mode].get(lab, {}).items()):
                xs = sorted(s for s, v in pts.items() if isinstance(v, float))
                seen += xs
                if xs:
                    ax.plot(xs, [pts[s] for s in xs], marker="o", label=backend, color=colors[backend])
            _seqlen_axis(ax, seen)
            top = max((y for ln in ax.lines for y in ln.get_ydata()), default=1.0)
            ax.set_ylim(0, 1.12 * top)
            ax.set_title(f"{lab}, {mode}", fontsize=9)
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    return _save(fig, out / "tflops_vs_seqlen.png", f"TFLOP/s vs sequence length - {_title_suffix(data)}")


def plot_bars(data: dict, out: Path, mode: str) -> Path | None:
    series = _series(data, _tflops(mode))
    labels = sorted(lab for lab, s in series.items() if any(isinstance(v, float) for b in s.values() for v in b.values()))
    if not labels:
        return None
    plt = _plt()
    colors = _colors(data)
    fig, axes = _grid(plt, len(labels), 1)
    for i, lab in enumerate(labels):
        ax = axes[i][0]
        backends = sorted(series[lab])
        seqlens = sorted({s for b in backends for s in series[lab][b]})
        width = 0.8 / max(1, len(backends))
        for k, backend in enumerate(backends):
            for x, s in enumerate(seqlens):
                v = series[lab][backend].get(s)
                pos = x - 0.4 + width * (k + 0.5)
                if isinstance(v, float):
                    ax.bar(pos, v, width, color=colors[backend], label=backend)
                    ax.text(pos, v, f"{v:.0f}", ha="center", va="bottom", fontsize=6)
                elif v == "OOM":
                    ax.text(pos, 0, "OOM", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_xticks(range(len(seqlens)), [str(s) for s in seqlens])
        ax.set_xlabel("sequence length")
        ax.set_ylabel(f"{mode} TFLOP/s")
        ax.set_title(lab, fontsize=9)
        handles, names = ax.get_legend_handles_labels()
        uniq = dict(zip(names, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=min(4, len(uniq)))
        ax.grid(axis="y", alpha=0.3)
    safe = mode.replace("+", "_")
    return _save(fig, out / f"bars_{safe}.png", f"{mode} TFLOP/s - {_title_suffix(data)}")


def plot_memory(data: dict, out: Path) -> Path | None:
    def peak(rec):
        m = rec.get("memory") or {}
        return m.get("peak_mib")

    series = _series(data, peak)
    labels = sorted(series)
    if not labels:
        return None
    plt = _plt()
    colors = _colors(data)
    fig, axes = _grid(plt, 1, len(labels))
    for j, lab in enumerate(labels):
        ax = axes[0][j]
        seen = []
        for backend, pts in sorted(series[lab].items()):
            xs = sorted(pts)
            seen += xs
            ax.plot(xs, [pts[s] for s in xs], marker="o", label=backend, color=colors[backend])
        _seqlen_axis(ax, seen)
        ax.set_yscale("log")
        ax.set_title(lab, fontsize=9)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("peak MiB above inputs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out / "memory_vs_seqlen.png", f"memory (fwd+bwd peak) - {_title_suffix(data)}")


def write_plots(data: dict, out) -> list[Path]:
    """Every plot that has data; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    modes = [m for m in (data.get("settings") or {}).get("modes") or MODES if m in MODES]
    paths = [plot_lines(data, out, modes)]
    paths += [plot_bars(data, out, m) for m in modes]
    paths.append(plot_memory(data, out))
    return [p for p in paths if p is not None]
