"""The errors the package raises: one class per kind of failure ``wsctl`` reports (``--error-format json``), each
carrying exactly the one-line message ``wsctl`` prints, so a notebook shows the same advice a terminal does."""

from __future__ import annotations


class WeightstreamError(Exception):
    """Any failure of a weightstream call. ``kind`` is wsctl's name for it, ``message`` its one line."""

    kind: str = "failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidJobError(WeightstreamError, ValueError):
    """The job is not runnable as written (manifest, spec, plan or data); nothing was started or sent."""

    kind = "invalid-job"


class UnsupportedModelError(InvalidJobError):
    """A PyTorch module or Hugging Face model has a layer or an architecture weightstream cannot run (named)."""

    kind = "unsupported-model"


class ClusterUnreachableError(WeightstreamError, ConnectionError):
    """No usable kubeconfig, or the cluster in it does not answer."""

    kind = "unreachable"


class NotInstalledError(WeightstreamError):
    """The cluster does not serve the TrainingJob API: weightstream is not installed there."""

    kind = "not-installed"


class JobNotFoundError(WeightstreamError, LookupError):
    """The named job does not exist (or was deleted while it was waited for)."""

    kind = "not-found"


class JobExistsError(WeightstreamError):
    """A job of that name exists already."""

    kind = "already-exists"


class RequestRefusedError(WeightstreamError):
    """The API server refused the request (forbidden, invalid, conflict)."""

    kind = "refused"


class WaitTimeoutError(WeightstreamError, TimeoutError):
    """A wait ran out of time."""

    kind = "timeout"


class JobFailedError(WeightstreamError):
    """The job ran and failed; the message is the reason its status gives."""

    kind = "job-failed"


class RunFailedError(WeightstreamError):
    """Anything else wsctl reports: a local run that failed, a file that cannot be written, a checkpoint that does
    not verify."""

    kind = "failed"


_BY_KIND: dict[str, type[WeightstreamError]] = {
    cls.kind: cls
    for cls in (
        InvalidJobError,
        UnsupportedModelError,
        ClusterUnreachableError,
        NotInstalledError,
        JobNotFoundError,
        JobExistsError,
        RequestRefusedError,
        WaitTimeoutError,
        JobFailedError,
        RunFailedError,
    )
}


def from_kind(kind: str, message: str) -> WeightstreamError:
    """The exception for a failure wsctl reported as ``kind`` (an unknown kind, from a newer wsctl, is a
    :class:`RunFailedError`)."""
    return _BY_KIND.get(kind, RunFailedError)(message)
