"""Jobs on a Kubernetes cluster, through the user's kubeconfig: submit, read, watch, wait, follow logs, suspend,
resume, cancel and fetch checkpoints. Each call is a ``wsctl`` cluster command (the same client, the same
waits with deadlines, the same messages); Python only reads the JSON it prints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _wsctl
from ._progress import Bar, rate
from .errors import JobFailedError, RunFailedError
from .job import TrainingJob

#: Phases after which a job never runs again.
TERMINAL = ("Succeeded", "Failed")
#: How long waits last unless told otherwise, as wsctl's own default.
DEFAULT_TIMEOUT = 3600.0


@dataclass(frozen=True)
class JobStatus:
    """A job as its status reports it: what ``wsctl get`` shows in its columns, and the whole object in ``raw``."""

    name: str
    namespace: str
    phase: str | None
    cs2: int
    cs2_allocated: int
    step: int | None
    total_steps: int | None
    loss: float | None
    samples_per_second: float | None
    eta_seconds: int | None
    queue_position: int | None
    waiting_for: str | None
    eval_loss: float | None
    eval_accuracy: float | None
    restarts: int
    conditions: list[dict[str, Any]] = field(default_factory=list)
    #: Where each pod runs (``status.placement``): ``{"role", "pod", "node"}`` each, as ``wsctl get -o wide`` shows.
    placement: list[dict[str, str]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_object(cls, job: dict[str, Any]) -> "JobStatus":
        """Reads a TrainingJob object as the API serves it."""
        meta, spec, status = job.get("metadata", {}), job.get("spec", {}), job.get("status") or {}
        progress = status  # The status carries the progress fields inline (serde flatten).
        conditions = list(status.get("conditions") or [])
        waiting = None
        if status.get("phase") == "Queued":
            waiting = next((c.get("reason") for c in conditions if c.get("type") == "Admitted" and c.get("status") != "True"), None)
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            phase=status.get("phase"),
            cs2=int(spec.get("cs2", 0)),
            cs2_allocated=int(status.get("allocatedCs2") or 0),
            step=progress.get("step"),
            total_steps=progress.get("totalSteps"),
            loss=progress.get("loss"),
            samples_per_second=progress.get("samplesPerSecond"),
            eta_seconds=status.get("estimatedRemainingSeconds"),
            queue_position=status.get("queuePosition"),
            waiting_for=waiting,
            eval_loss=progress.get("evalLoss"),
            eval_accuracy=progress.get("evalAccuracy"),
            restarts=int(status.get("restarts") or 0),
            conditions=conditions,
            placement=list(status.get("placement") or []),
            raw=job,
        )

    @property
    def nodes(self) -> list[str]:
        """The nodes the job's pods run on, each once."""
        return sorted({p["node"] for p in self.placement if p.get("node")})

    @property
    def done(self) -> bool:
        """Whether the job is over (Succeeded or Failed)."""
        return self.phase in TERMINAL


class Cluster:
    """A cluster reached with a kubeconfig (default: ``$KUBECONFIG`` or ``~/.kube/config``, as kubectl), acting in
    ``namespace`` (default: the manifest's, else the context's)."""

    def __init__(self, kubeconfig: str | Path | None = None, namespace: str | None = None) -> None:
        self.kubeconfig = Path(kubeconfig) if kubeconfig is not None else None
        self.namespace = namespace

    def _env(self) -> dict[str, str] | None:
        return {"KUBECONFIG": str(self.kubeconfig)} if self.kubeconfig is not None else None

    def _ns(self) -> list[str]:
        return ["-n", self.namespace] if self.namespace else []

    def _run(self, args: list[str], **kwargs: Any) -> str:
        return _wsctl.run(args, env=self._env(), **kwargs)

    def submit(self, job: TrainingJob) -> "ClusterJob":
        """Creates ``job`` (checked by wsctl first: nothing is sent if it is invalid) and returns its handle."""
        path, stdin = job._input()
        self._run(["submit", path, *self._ns()], stdin=stdin)
        namespace = self.namespace or job.manifest.get("metadata", {}).get("namespace")
        return ClusterJob(Cluster(self.kubeconfig, namespace), job.name)

    def job(self, name: str) -> "ClusterJob":
        """The handle of an existing job (not checked until used)."""
        return ClusterJob(self, name)

    def get(self, name: str) -> JobStatus:
        """The job's status now; :class:`JobNotFoundError` if there is none."""
        return JobStatus.from_object(json.loads(self._run(["get", name, "-o", "json", *self._ns()])))

    def list(self, all_namespaces: bool = False) -> list[JobStatus]:
        """Every job of the namespace (or of all namespaces), by namespace and name."""
        scope = ["-A"] if all_namespaces else self._ns()
        listing = json.loads(self._run(["get", "-o", "json", *scope]))
        return [JobStatus.from_object(item) for item in listing.get("items", [])]

    def watch(self, name: str, timeout: float = DEFAULT_TIMEOUT, progress: bool = False) -> Iterator[JobStatus]:
        """The job at every change of its status, ending after it succeeds or fails (a suspend is not an end:
        the watch reports Suspended and then the resumed phases); :class:`WaitTimeoutError` after ``timeout``
        seconds. ``progress=True`` also shows a ``tqdm.auto`` bar."""
        try:
            yield from self._changes(name, timeout, progress)
        except JobFailedError:
            return  # The Failed status was the last one yielded.

    def wait(self, name: str, timeout: float = DEFAULT_TIMEOUT, progress: bool = False) -> JobStatus:
        """Waits for the job to end: its status once Succeeded; :class:`JobFailedError` (with its status's
        reason, as wsctl words it) once Failed; :class:`WaitTimeoutError` after ``timeout`` seconds."""
        last: JobStatus | None = None
        for last in self._changes(name, timeout, progress):
            pass
        if last is None:
            raise RunFailedError(f"the watch of {name} ended without reporting the job")
        return last

    def _changes(self, name: str, timeout: float, progress: bool) -> Iterator[JobStatus]:
        """``wsctl get NAME --watch -o json``: each status change, then wsctl's verdict (its error once Failed)."""
        args = ["get", name, "--watch", "-o", "json", "--timeout", str(int(timeout)), *self._ns()]
        bar = Bar(name, None, progress) if progress else None
        try:
            with _wsctl.Lines(args, env=self._env()) as lines:
                for line in lines:
                    try:
                        status = JobStatus.from_object(json.loads(line))
                    except (json.JSONDecodeError, AttributeError):
                        continue
                    if bar is not None:
                        shown = rate(status.samples_per_second, _tokens(status))
                        extra = {"loss": f"{status.loss:.4f}"} if status.loss is not None else {}
                        bar.update(status.step, status.total_steps, phase=status.phase or "-", **extra, **({"rate": shown} if shown else {}))
                    yield status
        finally:
            if bar is not None:
                bar.close()

    def logs(
        self,
        name: str,
        role: str = "memoryx",
        index: int | None = None,
        follow: bool = False,
        tail: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Iterator[str]:
        """The log lines of the job's pods of ``role`` (``[pod] line`` when there are several). With
        ``follow=True`` it waits for Pending pods to run, yields lines as they come and ends when the job ends
        (or after ``timeout`` seconds)."""
        args = ["logs", name, "--role", role, "--timeout", str(int(timeout)), *self._ns()]
        if index is not None:
            args += ["--index", str(index)]
        if follow:
            args.append("--follow")
        if tail is not None:
            args += ["--tail", str(tail)]
        with _wsctl.Lines(args, env=self._env()) as lines:
            yield from lines

    def suspend(self, name: str, wait: bool = True, timeout: float = 600) -> None:
        """Suspends the job (it checkpoints and gives its CS-2s back); with ``wait``, returns once Suspended."""
        self._run(["suspend", name, *self._ns(), *_wait_args(wait, timeout)])

    def resume(self, name: str, wait: bool = True, timeout: float = 300) -> None:
        """Resumes a suspended job from its checkpoint; with ``wait``, returns once it left Suspended."""
        self._run(["resume", name, *self._ns(), *_wait_args(wait, timeout)])

    def cancel(self, name: str, wait: bool = True, timeout: float = 300) -> None:
        """Deletes the job; with ``wait``, returns once it, its pods and its volumes are gone."""
        self._run(["cancel", name, *self._ns(), *_wait_args(wait, timeout)])

    def set_priority(self, name: str, priority_class: str) -> None:
        """Sets the job's PriorityClass (``spec.priorityClassName``), which must exist; it orders the queue."""
        self._run(["set-priority", name, priority_class, *self._ns()])

    def label(self, name: str, labels: dict[str, str | None], overwrite: bool = False) -> None:
        """Sets the job's labels (a ``None`` value removes one); a label it has changes only with ``overwrite``."""
        changes = [f"{k}-" if v is None else f"{k}={v}" for k, v in labels.items()]
        self._run(["label", name, *changes, *self._ns(), *(["--overwrite"] if overwrite else [])])

    def checkpoints(self, name: str, timeout: float = 120) -> list[dict[str, Any]]:
        """The checkpoints the running job's MemoryX holds, newest first (``step``, ``file``, ``bytes``)."""
        out = self._run(["checkpoint", "list", name, "--json", "--timeout", str(int(timeout)), *self._ns()])
        return list(json.loads(out))

    def pull(self, name: str, step: int | None = None, to: str | Path = ".", timeout: float = 600) -> Path:
        """Fetches one checkpoint (the newest unless ``step``), verified, into folder ``to``; returns its path."""
        args = ["checkpoint", "pull", name, "--out", str(to), "--timeout", str(int(timeout)), *self._ns()]
        if step is not None:
            args += ["--step", str(step)]
        return Path(self._run(args).strip().splitlines()[-1])


def _wait_args(wait: bool, timeout: float) -> list[str]:
    return ["--timeout", str(int(timeout))] if wait else ["--no-wait"]


def _tokens(status: JobStatus) -> int | None:
    model = status.raw.get("spec", {}).get("model", {})
    return model.get("contextLength") if model.get("kind") in ("gpt", "llama") else None


class ClusterJob:
    """One job on a cluster, by name: the :class:`Cluster` calls without repeating the name."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name

    def status(self) -> JobStatus:
        """See :meth:`Cluster.get`."""
        return self.cluster.get(self.name)

    def watch(self, timeout: float = DEFAULT_TIMEOUT, progress: bool = False) -> Iterator[JobStatus]:
        """See :meth:`Cluster.watch`."""
        return self.cluster.watch(self.name, timeout=timeout, progress=progress)

    def wait(self, timeout: float = DEFAULT_TIMEOUT, progress: bool = False) -> JobStatus:
        """See :meth:`Cluster.wait`."""
        return self.cluster.wait(self.name, timeout=timeout, progress=progress)

    def logs(self, role: str = "memoryx", index: int | None = None, follow: bool = False, tail: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> Iterator[str]:
        """See :meth:`Cluster.logs`."""
        return self.cluster.logs(self.name, role=role, index=index, follow=follow, tail=tail, timeout=timeout)

    def suspend(self, wait: bool = True, timeout: float = 600) -> None:
        """See :meth:`Cluster.suspend`."""
        self.cluster.suspend(self.name, wait=wait, timeout=timeout)

    def resume(self, wait: bool = True, timeout: float = 300) -> None:
        """See :meth:`Cluster.resume`."""
        self.cluster.resume(self.name, wait=wait, timeout=timeout)

    def cancel(self, wait: bool = True, timeout: float = 300) -> None:
        """See :meth:`Cluster.cancel`."""
        self.cluster.cancel(self.name, wait=wait, timeout=timeout)

    def set_priority(self, priority_class: str) -> None:
        """See :meth:`Cluster.set_priority`."""
        self.cluster.set_priority(self.name, priority_class)

    def label(self, labels: dict[str, str | None], overwrite: bool = False) -> None:
        """See :meth:`Cluster.label`."""
        self.cluster.label(self.name, labels, overwrite=overwrite)

    def checkpoints(self, timeout: float = 120) -> list[dict[str, Any]]:
        """See :meth:`Cluster.checkpoints`."""
        return self.cluster.checkpoints(self.name, timeout=timeout)

    def pull(self, step: int | None = None, to: str | Path = ".", timeout: float = 600) -> Path:
        """See :meth:`Cluster.pull`."""
        return self.cluster.pull(self.name, step=step, to=to, timeout=timeout)

    def __repr__(self) -> str:
        return f"ClusterJob({self.name!r}, namespace={self.cluster.namespace!r})"
