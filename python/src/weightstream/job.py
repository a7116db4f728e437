"""A TrainingJob as Python holds it: the manifest (a dict, exactly the YAML's), built from keyword arguments, a
dict or a file, and handed to ``wsctl`` to plan or run. Python never validates it: ``wsctl`` does (the same code
as the operator), and a refusal comes back as :class:`~weightstream.errors.InvalidJobError` with wsctl's line.
A job knows nothing of clusters: :meth:`weightstream.Cluster.submit` takes one."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import _wsctl
from ._progress import Bar, rate
from .errors import RunFailedError

if TYPE_CHECKING:
    import pandas

API_VERSION = "weightstream.dev/v1beta1"
KIND = "TrainingJob"
#: A checkpoint's file as MemoryX names it: one file, or the manifest of one spread over several weight servers.
_CHECKPOINT = re.compile(r"step-(\d+)\.(?:safetensors|manifest\.json)")


class TrainingJob:
    """One TrainingJob manifest. ``TrainingJob("mnist", model={...}, data={...}, training={...})`` takes the spec's
    fields as keyword arguments (spelled as in the YAML: ``cs2``, ``model``, ``data``, ``training``,
    ``checkpoint``, ``memoryx``, ...); :meth:`from_dict` and :meth:`from_yaml` take a whole manifest."""

    def __init__(self, name: str, *, namespace: str | None = None, **spec: Any) -> None:
        metadata: dict[str, Any] = {"name": name}
        if namespace is not None:
            metadata["namespace"] = namespace
        self.manifest: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
        self._source: Path | None = None
        self._source_manifest: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, manifest: Mapping[str, Any]) -> "TrainingJob":
        """A job from a whole manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``), taken as given."""
        job = cls.__new__(cls)
        job.manifest = copy.deepcopy(dict(manifest))
        job._source = None
        job._source_manifest = None
        return job

    @classmethod
    def from_yaml(cls, path: str | Path) -> "TrainingJob":
        """A job from a manifest file. While it is unchanged, wsctl reads the file itself, so its errors name it
        exactly as ``wsctl plan FILE`` does."""
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as e:
            raise RunFailedError(f"cannot read {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            # wsctl words the syntax error; ask it.
            _wsctl.run(["plan", "--json", str(path)])
            raise RunFailedError(f"{path}: {e}") from None
        job = cls.from_dict(loaded if isinstance(loaded, dict) else {"spec": loaded})
        job._source = path
        job._source_manifest = copy.deepcopy(job.manifest)
        return job

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return str(self.manifest.get("metadata", {}).get("name", ""))

    @property
    def spec(self) -> dict[str, Any]:
        """``spec``, to read or change in place."""
        return self.manifest.setdefault("spec", {})

    def to_yaml(self) -> str:
        """The manifest as YAML, as ``wsctl`` and ``kubectl`` read it."""
        return yaml.safe_dump(self.manifest, sort_keys=False)

    def save(self, path: str | Path) -> Path:
        """Writes the manifest to ``path`` (YAML)."""
        path = Path(path)
        path.write_text(self.to_yaml())
        return path

    def _input(self) -> tuple[str, str | None]:
        """What to give wsctl as the job: the file it came from while unchanged, else the manifest on stdin."""
        if self._source is not None and self.manifest == self._source_manifest:
            return str(self._source), None
        return "-", json.dumps(self.manifest)

    def plan(self, cs2: int | None = None) -> dict[str, Any]:
        """The appliance the job gets (``wsctl plan --json``): MemoryX's servers, the SwarmX tree, the engines'
        SRAM, every stream unit, the simulated step. Raises :class:`InvalidJobError` if it cannot run."""
        path, stdin = self._input()
        args = ["plan", "--json", path, *(["--cs2", str(cs2)] if cs2 is not None else [])]
        return dict(_wsctl.run_json(args, stdin=stdin))

    def validate(self) -> None:
        """Checks the job as the operator would; raises :class:`InvalidJobError` with wsctl's message if not."""
        self.plan()

    def run_local(
        self,
        cs2: int | None = None,
        out: str | Path | None = None,
        *,
        in_process: bool = False,
        volumes: Mapping[str, str | Path] | None = None,
        checkpoint_dir: str | Path | None = None,
        progress: bool = True,
    ) -> "RunResult":
        """Trains the job on this machine (MemoryX, the SwarmX tree, engines and input workers as local processes, or
        with ``in_process`` as threads of one), evaluates it and returns the summary and per-step metrics. A
        ``tqdm.auto`` bar shows step/total, loss, throughput and ETA unless ``progress=False``. ``out`` defaults to
        ``runs/<name>``; ``volumes`` maps a claim the data names to a folder standing in for it. As with ``wsctl
        run``, a job that checkpoints resumes from the newest checkpoint in its folder."""
        path, stdin = self._input()
        args = ["run", "--json", path]
        if cs2 is not None:
            args += ["--cs2", str(cs2)]
        if out is not None:
            args += ["--out", str(out)]
        if in_process:
            args.append("--in-process")
        if checkpoint_dir is not None:
            args += ["--checkpoint-dir", str(checkpoint_dir)]
        for claim, folder in (volumes or {}).items():
            args += ["--volume", f"{claim}={folder}"]
        bar: Bar | None = None
        tokens: int | None = None
        summary: dict[str, Any] | None = None
        out_dir: Path | None = None
        checkpoints: Path | None = None
        try:
            with _wsctl.Lines(args, stdin=stdin) as lines:
                for line in lines:
                    event = _event(line)
                    if "start" in event:
                        start = event["start"]
                        tokens = start.get("tokensPerSample")
                        bar = Bar(self.name, int(start.get("steps") or 0) or None, progress)
                    elif "progress" in event and bar is not None:
                        p = event["progress"]
                        bar.update(int(p["step"]), loss=f"{p['loss']:.4f}", rate=rate(p.get("samples_per_s"), tokens) or "")
                    elif "summary" in event:
                        summary, out_dir = event["summary"], Path(event["out"])
                        # Where wsctl put the checkpoints (``--checkpoint-dir``, else OUT/checkpoints), if anywhere.
                        checkpoints = Path(event["checkpoints"]) if event.get("checkpoints") else None
        finally:
            if bar is not None:
                bar.close()
        if summary is None or out_dir is None:
            raise RunFailedError(f"wsctl run {path} ended without a summary")
        return RunResult(summary=summary, metrics=_metrics(out_dir / "metrics.jsonl"), out=out_dir, checkpoint_dir=checkpoints)

    def __repr__(self) -> str:
        return f"TrainingJob({self.name!r}, spec={self.spec!r})"


def _event(line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return {}
    return event if isinstance(event, dict) else {}


def _metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


@dataclass
class RunResult:
    """What a local run gives back: wsctl's ``summary.json`` (final loss, held-out evaluation, throughput, bytes
    streamed, engines' utilisation), the per-step metrics (``metrics.jsonl``), the folder they are in and the
    folder the checkpoints went to (as wsctl reports it: ``checkpoint_dir=`` when given, else ``out/checkpoints``
    when the job checkpoints, else None)."""

    summary: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    out: Path = Path(".")
    checkpoint_dir: Path | None = None

    @property
    def final_loss(self) -> float:
        """The last step's mean loss (NaN when a resumed run had no step left to run)."""
        loss = self.summary.get("final_loss")
        return float("nan") if loss is None else float(loss)

    @property
    def eval(self) -> dict[str, Any]:
        """The held-out evaluation: ``loss``, ``accuracy`` (or ``perplexity``), ``samples``."""
        return dict(self.summary["eval"])

    def checkpoints(self) -> list[Path]:
        """The checkpoints in the folder the run used (:attr:`checkpoint_dir`), oldest first: those it wrote, and
        any a run before it left there."""
        folder = self.checkpoint_dir
        if folder is None or not folder.is_dir():
            return []
        found = ((_CHECKPOINT.fullmatch(p.name), p) for p in folder.iterdir() if p.is_file())
        return [p for m, p in sorted((int(m[1]), p) for m, p in found if m)]

    def dataframe(self) -> "pandas.DataFrame":
        """The per-step metrics as a ``pandas.DataFrame`` indexed by step (needs pandas)."""
        try:
            import pandas
        except ImportError:
            raise RunFailedError("dataframe() needs pandas: install the package with its notebook extra, pip install './python[notebook]'") from None
        return pandas.DataFrame(self.metrics).set_index("step")

    def plot_loss(self, ax: Any = None) -> Any:
        """Draws the loss curve (matplotlib) on ``ax`` or a new figure and returns the axes."""
        from .plot import plot_loss

        return plot_loss(self.metrics, ax=ax, title=self.out.name)

