"""Pictures of benchmark results, drawn from the figures a verify.py has just recomputed.

Every experiment's ``draw(raw, folder)`` (next to its ``recompute`` in run.py) turns raw
samples into PNGs through the three chart kinds here, so all of them read the same way:

- ``phases``: where a transition's time goes, one stacked bar per arm (each segment the
  median of its phase over the samples), and beside it the median total with its IQR;
- ``medians``: one or more panels of median bars with IQR whiskers;
- ``fetched_reused``: what a delivery fetched from the source against what it reused.

``benchkit.verify`` calls ``draw`` only once the summary is reproduced from raw.json, and
``benchkit.write`` when a run ends, so a picture never shows what the raw data does not.
Each figure carries a footnote: n, what bars and whiskers are, the commit and the load.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 100
COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
MIB = 2**20


def footnote(raw: dict, what: str) -> str:
    """``what`` (n, bars, whiskers) plus the run's commit and load average, when recorded."""
    parts = [what]
    if raw.get("commit"):
        parts.append(f"commit {raw['commit'][:7]}")
    load, scope = raw.get("loadavg") or {}, raw.get("scope") or {}   # two shapes of raw.json
    before, after = load.get("before") or scope.get("loadavg_before"), load.get("after") or scope.get("loadavg_after")
    if before and after:
        parts.append(f"load avg {before[0]:.1f} before, {after[0]:.1f} after")
    return "; ".join(parts)


def _save(fig, path: Path, note: str) -> Path:
    fig.text(0.01, 0.01, note, fontsize=7, color="#555555", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _whisker(ax, x, stats: dict, **kw) -> None:
    """A median point with its IQR as an error bar."""
    m = stats["median"]
    ax.errorbar([x], [m], yerr=[[m - stats["q1"]], [stats["q3"] - m]], fmt="o", color="black",
                markersize=4, capsize=4, linewidth=1, **kw)


def arms_in_order(raw: dict) -> list[str]:
    """The arms as the first round ran them (benchkit.order: forward on round 0)."""
    return list(dict.fromkeys(s["arm"] for s in raw["samples"]))


def phases(path: Path, title: str, arms: list[str], segments: dict[str, list[float]],
           totals: list[dict], note: str, ylabel: str = "seconds") -> Path:
    """Stacked bars: ``segments[label][i]`` is the median of that phase in ``arms[i]``;
    ``totals[i]`` (benchkit.stats) is drawn beside each bar as median and IQR."""
    fig, ax = plt.subplots(figsize=(4.5 + 0.9 * len(arms), 4.2))
    xs = range(len(arms))
    bottom = [0.0] * len(arms)
    for (label, values), color in zip(segments.items(), COLORS):
        ax.bar(xs, values, bottom=bottom, width=0.55, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, st in enumerate(totals):
        _whisker(ax, i + 0.38, st, label="total: median, IQR" if i == 0 else None)
    ax.set_xticks(list(xs), arms, fontsize=9)
    ax.set_xlim(-0.6, len(arms) - 0.3)
    ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=11)
    handles, labels = ax.get_legend_handles_labels()   # the top phase first, as stacked
    ax.legend(handles[-2::-1] + handles[-1:], labels[-2::-1] + labels[-1:], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return _save(fig, path, note)


def medians(path: Path, title: str, panels: list[tuple[str, dict[str, dict]]], note: str,
            log: bool = False) -> Path:
    """One panel per ``(ylabel, {arm: benchkit.stats})``: a bar at each arm's median and
    its IQR as a whisker."""
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7.0, 3.2 * len(panels)), 4.2), squeeze=False)
    for ax, (ylabel, per_arm) in zip(axes[0], panels):
        labels = list(per_arm)
        crowded = len(labels) > 4
        for i, label in enumerate(labels):
            st = per_arm[label]
            ax.bar(i, st["median"], width=0.6, color=COLORS[i % len(COLORS)])
            ax.annotate(f"{st['median']:.3g}", (i, st["median"]), xytext=(-4, 2), textcoords="offset points",
                        ha="right", va="bottom", fontsize=8)
            ax.errorbar([i], [st["median"]], yerr=[[st["median"] - st["q1"]], [st["q3"] - st["median"]]],
                        fmt="none", color="black", capsize=4, linewidth=1)
        ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=30 if crowded else 0,
                      ha="right" if crowded else "center")
        ax.set_ylabel(ylabel, fontsize=9)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path, note)


def fetched_reused(path: Path, title: str, rows: dict[str, tuple[float, float]], note: str) -> Path:
    """Horizontal bars, one per row ``label: (fetched bytes, reused bytes)``, in MiB, each
    labelled with the share it fetched."""
    fig, ax = plt.subplots(figsize=(7, 0.55 * len(rows) + 1.8))
    labels = list(rows)
    ys = range(len(labels))
    fetched = [rows[k][0] / MIB for k in labels]
    reused = [rows[k][1] / MIB for k in labels]
    ax.barh(ys, fetched, color=COLORS[3], label="fetched from the source")
    ax.barh(ys, reused, left=fetched, color=COLORS[0], label="reused on the node")
    for y, label in zip(ys, labels):
        f, r = rows[label]
        ax.text((f + r) / MIB, y, f"  fetched {_size(f)} ({100 * f / (f + r):.1f} %)" if f + r else "",
                va="center", fontsize=8)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("MiB")
    ax.set_xlim(0, max(f + r for f, r in zip(fetched, reused)) * 1.6)
    fig.suptitle(title, fontsize=11)
    ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1, 1), ncol=2, frameon=False)
    return _save(fig, path, note)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MIB), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:.0f} B"
