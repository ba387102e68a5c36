"""The demo's picture: where each transition's time went, from the model's status.

One stacked bar per transition, split as ``status.lastTransition.durations`` splits it:
the bridge's staging, the owner's own work (apply, verify, first token) and what is left
of the total, the operator's share (``overheadSeconds``). On one node the segments add up
to the bar's ``totalSeconds``, written on top, so the picture shows the numbers of the
demo's table (on several nodes the slowest bridge and owner are drawn, and may overlap).

matplotlib comes with the ``test`` extra that scripts/bootstrap installs; it is imported
only here, when the demo draws, so the image (which ships localcluster) does not need it.
"""

from __future__ import annotations

from pathlib import Path

PHASES = (("stagingSeconds", "bridge: staging", "#4c72b0"),
          ("ownerSeconds", "owner: apply to first token", "#dd8452"),
          ("overheadSeconds", "operator", "#55a868"))


def segments(transitions: list[tuple[str, dict]]) -> dict[str, list[float]]:
    """``{phase label: [seconds of each transition]}`` from each ``lastTransition.durations``."""
    return {label: [float((last.get("durations") or {}).get(key) or 0.0) for _, last in transitions]
            for key, label, _ in PHASES}


def draw_transitions(transitions: list[tuple[str, dict]], path: Path, title: str) -> Path:
    """A PNG at ``path``: one stacked bar per ``(label, lastTransition)``, its total written on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, _ in transitions]
    fig, ax = plt.subplots(figsize=(3.5 + 1.3 * len(labels), 4.0))
    bottom = [0.0] * len(labels)
    for (label, values), (_, _, color) in zip(segments(transitions).items(), PHASES):
        ax.bar(range(len(labels)), values, bottom=bottom, width=0.55, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, (_, last) in enumerate(transitions):
        total = float((last.get("durations") or {}).get("totalSeconds") or 0.0)
        ax.annotate(f"{total:.2f} s", (i, bottom[i]), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_ylim(0, max(bottom + [0.1]) * 1.2)
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.01, "one run; from status.lastTransition.durations of each switch", fontsize=7,
             color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
