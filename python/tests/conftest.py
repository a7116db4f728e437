"""What the package's tests share: the repository as the working folder (the examples' data paths are relative
to it), small jobs, and the cluster when one is up (e2e/tests/python.rs runs this suite with
WEIGHTSTREAM_TEST_KUBECONFIG and WEIGHTSTREAM_TEST_NAMESPACE set; without them the cluster tests are skipped)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import pytest

import weightstream as ws

matplotlib.use("Agg")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def at_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def mnist_job(name: str = "py-mnist", steps: int = 60, **changes: object) -> ws.TrainingJob:
    """examples/jobs/fc-mnist.yaml renamed and cut to ``steps`` steps."""
    job = ws.TrainingJob.from_yaml(REPO / "examples/jobs/fc-mnist.yaml")
    job.manifest["metadata"]["name"] = name
    training = job.spec["training"]
    training.pop("epochs", None)
    training["steps"] = steps
    job.spec.update(changes)
    return job


@pytest.fixture(scope="session")
def cluster() -> ws.Cluster:
    kubeconfig = os.environ.get("WEIGHTSTREAM_TEST_KUBECONFIG")
    namespace = os.environ.get("WEIGHTSTREAM_TEST_NAMESPACE")
    if not kubeconfig or not namespace:
        pytest.skip("no cluster: e2e/tests/python.rs sets WEIGHTSTREAM_TEST_KUBECONFIG and WEIGHTSTREAM_TEST_NAMESPACE")
    return ws.Cluster(kubeconfig=kubeconfig, namespace=namespace)
