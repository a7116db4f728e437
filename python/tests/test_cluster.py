"""Every cluster call against a real cluster (the local single-node one of e2e/cluster, brought up and handed
over by e2e/tests/python.rs), and the errors a user meets without one."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

import weightstream as ws
from weightstream import _wsctl

from conftest import REPO, mnist_job


def _job(name: str, steps: int) -> ws.TrainingJob:
    """examples/jobs/fc-mnist-sparse.yaml on 2 CS-2s for ``steps`` steps, a checkpoint every 200."""
    job = ws.TrainingJob.from_yaml(REPO / "examples/jobs/fc-mnist-sparse.yaml")
    job.manifest["metadata"]["name"] = name
    job.spec["cs2"] = 2
    job.spec["training"].pop("epochs", None)
    job.spec["training"]["steps"] = steps
    job.spec["checkpoint"] = {"intervalSteps": 200, "keep": 10}
    return job


def _until(what: str, check, timeout: float = 300):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


class Collect(threading.Thread):
    """Drains an iterator on a thread, keeping what it yields and how it ended."""

    def __init__(self, items) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.items_iter, self.items, self.error = items, [], None
        self.start()

    def run(self) -> None:
        try:
            for item in self.items_iter:
                self.items.append(item)
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            self.error = e


def test_a_job_on_the_cluster_from_submit_to_cancel(cluster: ws.Cluster, tmp_path: Path) -> None:
    steps = 4000
    handle = cluster.submit(_job("py-flow", steps))
    # Started at once, while the pods are still Pending: the log waits for them and yields MemoryX's lines.
    logs = Collect(handle.logs(follow=True, timeout=900))
    watch = Collect(handle.watch(timeout=900))
    with pytest.raises(ws.JobExistsError, match="py-flow already exists"):
        cluster.submit(_job("py-flow", steps))

    _until("the job to train past step 300", lambda: (s := handle.status()).phase == "Running" and (s.step or 0) >= 300)
    # Where its pods run, as the status says: every role placed on a node the cluster has.
    running = handle.status()
    roles = {p["role"] for p in running.placement}
    assert {"memoryx", "swarmx", "engine", "input"} <= roles, running.placement
    assert running.nodes and all(p["node"] in running.nodes for p in running.placement), running.placement
    engine = list(handle.logs(role="engine", index=1, tail=50))
    assert any("engine ready" in line for line in engine), engine
    listing = handle.checkpoints()
    assert listing and listing[0]["step"] % 200 == 0 and listing[0]["file"].startswith("step-"), listing
    pulled = handle.pull(step=listing[0]["step"], to=tmp_path)
    assert pulled.parent == tmp_path and pulled.name == listing[0]["file"] and pulled.stat().st_size > 0

    handle.suspend(timeout=300)
    status = handle.status()
    assert (status.phase, status.cs2_allocated) == ("Suspended", 0)
    # Labels and the PriorityClass through wsctl: set, refused without overwrite, removed; a missing class refused.
    handle.label({"team": "ml"})
    assert handle.status().raw["metadata"]["labels"]["team"] == "ml"
    with pytest.raises(ws.WeightstreamError, match="--overwrite"):
        handle.label({"team": "web"})
    handle.label({"team": None})
    assert "team" not in (handle.status().raw["metadata"].get("labels") or {})
    with pytest.raises(ws.WeightstreamError, match="does not exist"):
        handle.set_priority("no-such-class")
    handle.resume(timeout=300)
    final = handle.wait(timeout=900)
    assert (final.phase, final.step, final.total_steps) == ("Succeeded", steps, steps)
    assert final.loss is not None and final.eval_accuracy is not None and final.eval_accuracy > 0.8

    # The watch started before the suspend reported it, then the resumed run, to the end.
    watch.join(timeout=120)
    assert not watch.is_alive() and watch.error is None, watch.error
    phases = [s.phase for s in watch.items]
    assert "Suspended" in phases and phases[-1] == "Succeeded", phases
    after = phases[phases.index("Suspended") :]
    assert "Running" in after, phases
    steps_seen = [s.step for s in watch.items if s.step is not None]
    assert steps_seen[-1] == steps
    # The log, followed since Pending, ended with the job, having yielded MemoryX's start and end.
    logs.join(timeout=120)
    assert not logs.is_alive() and logs.error is None, logs.error
    text = "\n".join(logs.items)
    assert f'"total":{steps}' in text and '"event":"done"' in text, text[-2000:]

    assert [j.name for j in cluster.list()].count("py-flow") == 1
    got = cluster.get("py-flow")
    assert (got.phase, got.cs2, got.step) == ("Succeeded", 2, steps)
    assert any(j.name == "py-flow" for j in cluster.list(all_namespaces=True))

    handle.cancel(timeout=300)
    with pytest.raises(ws.JobNotFoundError) as raised:
        cluster.get("py-flow")
    assert raised.value.message == _said(cluster, ["get", "py-flow", "-n", str(cluster.namespace)])


def test_an_invalid_job_is_refused_before_anything_is_sent(cluster: ws.Cluster) -> None:
    job = _job("py-invalid", 10)
    job.spec["training"]["batchSize"] = 0
    with pytest.raises(ws.InvalidJobError, match="nothing was sent to the cluster"):
        cluster.submit(job)
    with pytest.raises(ws.JobNotFoundError):
        cluster.get("py-invalid")


def test_a_job_that_fails_raises_its_reason_from_wait(cluster: ws.Cluster) -> None:
    job = _job("py-fails", 10)
    job.spec["data"]["path"] = "examples/data/not-there"
    job.spec["restartLimit"] = 0
    handle = cluster.submit(job)
    try:
        with pytest.raises(ws.JobFailedError, match="py-fails failed: "):
            handle.wait(timeout=600)
    finally:
        handle.cancel(timeout=300)


def _said(cluster: ws.Cluster, args: list[str]) -> str:
    env = {"KUBECONFIG": str(cluster.kubeconfig)} if cluster.kubeconfig else None
    done = subprocess.run([_wsctl.binary(), *args], capture_output=True, text=True, check=False, env=_wsctl._env(env))
    assert done.returncode == 1 and done.stderr.startswith("error: "), done.stderr
    return done.stderr.strip().removeprefix("error: ")


def test_an_unreachable_cluster_is_one_typed_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: gone\n"
        "clusters: [{name: gone, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: gone, context: {cluster: gone, user: u, namespace: ml}}]\n"
    )
    gone = ws.Cluster(kubeconfig=kubeconfig)
    with pytest.raises(ws.ClusterUnreachableError) as raised:
        gone.get("anything")
    assert raised.value.message == _said(gone, ["get", "anything"])
    assert "is the cluster in your kubeconfig up?" in raised.value.message
    with pytest.raises(ws.ClusterUnreachableError, match="no usable kubeconfig"):
        ws.Cluster(kubeconfig=tmp_path / "missing").list()
    with pytest.raises(ws.ClusterUnreachableError):
        gone.submit(mnist_job("py-never"))


def test_a_handle_by_name_reads_the_same_job_and_a_missing_one_is_not_found(cluster: ws.Cluster) -> None:
    handle = cluster.job("py-nobody")
    assert (handle.name, handle.cluster) == ("py-nobody", cluster)
    with pytest.raises(ws.JobNotFoundError, match="no TrainingJob py-nobody"):
        handle.status()
    with pytest.raises(ws.JobNotFoundError):
        list(handle.watch(timeout=30))
    with pytest.raises(ws.JobNotFoundError):
        handle.cancel(timeout=30)
