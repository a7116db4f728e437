"""weightstream from Python: build a TrainingJob, see the appliance it gets, train it on this machine or on a
cluster, watch it, and take the trained model back to PyTorch.

    >>> import weightstream as ws
    >>> job = ws.TrainingJob.from_yaml("examples/jobs/fc-mnist.yaml")
    >>> result = job.run_local(cs2=2)          # a progress bar, then the summary and per-step metrics
    >>> result.plot_loss()

Everything is decided by the bundled ``wsctl`` (the spec, its validation, the plan, the cluster client); its
refusals arrive as the typed errors of :mod:`weightstream.errors`, with the line wsctl prints.
"""

from .cluster import Cluster, ClusterJob, JobStatus
from .errors import (
    ClusterUnreachableError,
    InvalidJobError,
    JobExistsError,
    JobFailedError,
    JobNotFoundError,
    NotInstalledError,
    RequestRefusedError,
    RunFailedError,
    UnsupportedModelError,
    WaitTimeoutError,
    WeightstreamError,
)
from .job import RunResult, TrainingJob
from .plot import plot_loss
from .pytorch import from_torch, to_torch, to_transformers
from .text import generate

__all__ = [
    "Cluster",
    "ClusterJob",
    "ClusterUnreachableError",
    "InvalidJobError",
    "JobExistsError",
    "JobFailedError",
    "JobNotFoundError",
    "JobStatus",
    "NotInstalledError",
    "RequestRefusedError",
    "RunFailedError",
    "RunResult",
    "TrainingJob",
    "UnsupportedModelError",
    "WaitTimeoutError",
    "WeightstreamError",
    "from_torch",
    "generate",
    "plot_loss",
    "to_torch",
    "to_transformers",
]
