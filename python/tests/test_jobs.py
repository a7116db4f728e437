"""TrainingJob: built three ways, planned and run by wsctl, refused with wsctl's own line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

import weightstream as ws
from weightstream import _wsctl

from conftest import REPO, mnist_job

EXAMPLE = REPO / "examples/jobs/fc-mnist.yaml"


def test_kwargs_dict_and_yaml_build_the_same_manifest() -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    from_file = ws.TrainingJob.from_yaml(EXAMPLE)
    from_dict = ws.TrainingJob.from_dict(manifest)
    from_kwargs = ws.TrainingJob(manifest["metadata"]["name"], **manifest["spec"])
    assert from_file.manifest == from_dict.manifest == from_kwargs.manifest == manifest
    assert yaml.safe_load(from_kwargs.to_yaml()) == manifest
    assert from_kwargs.name == "fc-mnist"


def test_plan_is_wsctls_plan_json() -> None:
    job = ws.TrainingJob.from_yaml(EXAMPLE)
    plan = job.plan()
    assert plan["cs2"] == 1 and plan["batch"] == 128 and len(plan["layers"]) == 3
    assert plan["simulated"]["engines"] == 1
    assert job.plan(cs2=4)["cs2"] == 4
    direct = _wsctl.run_json(["plan", "--json", str(EXAMPLE), "--cs2", "4"])
    assert job.plan(cs2=4) == direct


def _wsctl_says(args: list[str], stdin: str | None = None) -> str:
    """What wsctl itself prints for a failure, without --error-format."""
    done = subprocess.run([_wsctl.binary(), *args], input=stdin, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0].removeprefix("error: ")


def test_an_invalid_spec_raises_one_typed_error_with_wsctls_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("batchSize: 128", "batchSize: 0"))
    job = ws.TrainingJob.from_yaml(bad)
    with pytest.raises(ws.InvalidJobError) as raised:
        job.plan()
    assert raised.value.message == _wsctl_says(["plan", str(bad)])
    assert str(bad) in raised.value.message and "batchSize" in raised.value.message
    # Changed in Python, the job goes over standard input, and wsctl says so.
    job.spec["cs2"] = 500
    with pytest.raises(ws.InvalidJobError) as raised:
        job.run_local(progress=False)
    assert raised.value.message == _wsctl_says(["run", "-"], stdin=job.to_yaml())
    assert raised.value.message.startswith("standard input: ") and "spec.cs2" in raised.value.message


def test_data_that_is_not_there_is_an_invalid_job(tmp_path: Path) -> None:
    job = mnist_job(data={"kind": "mnist", "path": str(tmp_path / "nowhere")})
    with pytest.raises(ws.InvalidJobError, match="nowhere"):
        job.run_local(out=tmp_path / "out", progress=False)


def test_run_local_returns_the_summary_and_every_steps_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = mnist_job(steps=60)
    result = job.run_local(out=tmp_path / "run", progress=True)
    assert result.summary["steps"] == 60 and len(result.metrics) == 60
    assert [m["step"] for m in result.metrics] == list(range(1, 61))
    assert result.final_loss == result.metrics[-1]["loss"]
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    assert 0.7 < result.eval["accuracy"] <= 1.0 and result.eval["samples"] == 2000
    frame = result.dataframe()
    assert list(frame.index[:3]) == [1, 2, 3] and frame["loss"].iloc[-1] == result.final_loss
    ax = result.plot_loss()
    assert len(ax.lines) == 1 and list(ax.lines[0].get_xdata()) == list(range(1, 61))
    # The bar went to stderr (tqdm), with the job's name and the whole count.
    err = capsys.readouterr().err
    assert "py-mnist" in err and "60/60" in err and "loss=" in err


def test_in_process_and_processes_train_the_same_curve(tmp_path: Path) -> None:
    job = mnist_job(steps=20, cs2=2)
    a = job.run_local(out=tmp_path / "a", progress=False)
    b = job.run_local(out=tmp_path / "b", in_process=True, progress=False)
    assert [m["loss"] for m in a.metrics] == [m["loss"] for m in b.metrics]
    assert a.summary["cs2"] == b.summary["cs2"] == 2


def test_checkpoints_of_a_run_are_listed(tmp_path: Path) -> None:
    job = mnist_job(steps=20, checkpoint={"intervalSteps": 10, "keep": 5})
    result = job.run_local(out=tmp_path / "run", progress=False)
    names = [p.name for p in result.checkpoints()]
    assert names == ["step-00000010.safetensors", "step-00000020.safetensors"], names
    assert result.checkpoint_dir == tmp_path / "run" / "checkpoints"


def test_checkpoints_are_listed_where_the_run_put_them(tmp_path: Path) -> None:
    elsewhere = tmp_path / "kept"
    job = mnist_job(steps=20, checkpoint={"intervalSteps": 10, "keep": 5})
    result = job.run_local(out=tmp_path / "run", checkpoint_dir=elsewhere, progress=False, in_process=True)
    assert result.checkpoint_dir == elsewhere and not (tmp_path / "run" / "checkpoints").exists()
    assert result.checkpoints() == [elsewhere / "step-00000010.safetensors", elsewhere / "step-00000020.safetensors"]
    # A run that keeps none says so: no folder, no checkpoints.
    bare = mnist_job(steps=5).run_local(out=tmp_path / "bare", progress=False, in_process=True)
    assert bare.checkpoint_dir is None and bare.checkpoints() == []


def test_a_missing_wsctl_is_one_error_saying_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_wsctl.WSCTL_ENV, "/nonexistent/wsctl")
    with pytest.raises(ws.RunFailedError, match="WEIGHTSTREAM_WSCTL"):
        ws.TrainingJob.from_yaml(EXAMPLE).plan()


def test_validate_and_save_round_trip(tmp_path: Path) -> None:
    job = mnist_job("py-saved", steps=10)
    job.validate()
    saved = job.save(tmp_path / "job.yaml")
    again = ws.TrainingJob.from_yaml(saved)
    assert again.manifest == job.manifest
    again.validate()
    again.spec["training"]["batchSize"] = 0
    with pytest.raises(ws.InvalidJobError, match="batchSize"):
        again.validate()


def test_tensorboard_reads_every_steps_loss_as_metrics_jsonl_has_it(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    job = mnist_job(steps=30, checkpoint={"intervalSteps": 10, "keep": 5})
    job.run_local(out=run, progress=False, in_process=True)
    # Its last checkpoint gone, the run resumes from step 20 and trains 21..30 again in a second event file:
    # TensorBoard keeps each step once, as metrics.jsonl does.
    (run / "checkpoints" / "step-00000030.safetensors").unlink()
    result = job.run_local(out=run, progress=False, in_process=True)
    assert len(list(run.glob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(run))
    events.Reload()
    tags = {"loss", "learning_rate", "samples_per_s", "bytes_streamed", "eval_loss", "eval_accuracy", "engine_busy"}
    assert tags <= set(events.Tags()["scalars"]), events.Tags()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [m["step"] for m in result.metrics] == list(range(1, 31))
    # TensorBoard keeps scalars in 32 bits.
    assert [e.value for e in loss] == pytest.approx([m["loss"] for m in result.metrics], rel=1e-6)
    rate = [e.value for e in events.Scalars("learning_rate")]
    assert rate == pytest.approx([m["learning_rate"] for m in result.metrics], rel=1e-6)
    held_out = events.Scalars("eval_loss")
    assert [e.step for e in held_out] == [30] and held_out[0].value == pytest.approx(result.eval["loss"], rel=1e-6)
    busy = events.Scalars("engine_busy")
    assert [e.step for e in busy] == [30]
    assert busy[0].value == pytest.approx(result.summary["wse_utilization"], rel=1e-6)
