"""The progress bar ``run_local`` and ``watch`` show: ``tqdm.auto``, so a notebook gets its widget and a terminal
its text bar, with the step, the loss, the throughput in the model's unit and the time left."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm


class Bar:
    """A bar over a job's steps that can learn its total late (a cluster job's status says it once running)."""

    def __init__(self, description: str, total: int | None, enabled: bool) -> None:
        self._bar: Any = tqdm(total=total, desc=description, unit="step", disable=not enabled, dynamic_ncols=True)

    def update(self, step: int | None, total: int | None = None, **postfix: str) -> None:
        """Moves the bar to ``step`` of ``total`` and shows ``postfix`` (loss, throughput, phase)."""
        changed = total is not None and self._bar.total != total
        if changed:
            self._bar.total = total
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        if step is not None and step > self._bar.n:
            self._bar.update(step - self._bar.n)  # Redraws, at most as often as tqdm's own interval.
        elif changed or not self._bar.disable:
            self._bar.refresh()

    def close(self) -> None:
        """Leaves the bar as it ended."""
        self._bar.close()


def rate(samples_per_s: float | None, tokens_per_sample: int | None) -> str | None:
    """Throughput as users of the model count it: tokens a second for a language model, samples otherwise."""
    if samples_per_s is None:
        return None
    if tokens_per_sample:
        return f"{samples_per_s * tokens_per_sample:,.0f} tokens/s"
    return f"{samples_per_s:,.0f} samples/s"
