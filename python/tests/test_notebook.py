"""The example notebook runs end to end (its cluster cells too when a cluster is configured), as a user's kernel
would run it."""

from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

from conftest import REPO

NOTEBOOK = REPO / "examples/notebooks/quickstart.ipynb"


def test_the_quickstart_notebook_runs_without_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    env_kubeconfig = os.environ.get("WEIGHTSTREAM_TEST_KUBECONFIG")
    saved = {k: os.environ.get(k) for k in ("KUBECONFIG", "WEIGHTSTREAM_NAMESPACE", "MPLBACKEND")}
    try:
        # The kernel inherits this environment: the cluster section runs when the suite has one.
        if env_kubeconfig:
            os.environ["KUBECONFIG"] = env_kubeconfig
            os.environ["WEIGHTSTREAM_NAMESPACE"] = os.environ.get("WEIGHTSTREAM_TEST_NAMESPACE", "default")
        else:
            os.environ.pop("KUBECONFIG", None)
        os.environ["MPLBACKEND"] = "Agg"
        NotebookClient(notebook, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    outputs = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "InvalidJobError -> standard input: " in outputs and "spec.cs2" in outputs
    assert "GPT2LMHeadModel -> Call me Ishmael. " in outputs
    assert "held-out accuracy" in outputs and "started from " in outputs
    if (REPO / "models/smollm2-135m/model.safetensors").is_file():
        # The fine-tuning section: SmolLM2 writes before and after its few steps.
        assert "before: Call me Ishmael. Some years ago" in outputs and "after:  Call me Ishmael. Some years ago" in outputs, outputs
    if env_kubeconfig:
        assert "Succeeded 200" in outputs, outputs
    nbformat.write(notebook, tmp_path / "executed.ipynb")
