"""The loss curve, for a local run's metrics and a cluster job's reports alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import RunFailedError


def plot_loss(metrics: Sequence[dict[str, Any]], ax: Any = None, title: str | None = None) -> Any:
    """Draws loss against step from per-step records (``step``, ``loss``) on ``ax`` or a new figure."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise RunFailedError("plot_loss() needs matplotlib: install the package with its notebook extra, pip install './python[notebook]'") from None
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    steps = [m["step"] for m in metrics]
    ax.plot(steps, [m["loss"] for m in metrics], linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    return ax
