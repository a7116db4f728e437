"""PyTorch models in and out. :func:`from_torch` turns a ``torch.nn.Sequential`` of ``Linear`` layers and one
kind of activation into an MLP job, and a Hugging Face GPT-2 or Llama (a model, its config, or a folder) into a
decoder job whose shape wsctl reads from the config (``wsctl model``) and whose weights, where there are any,
the job starts from (``spec.model.from``). :func:`to_torch` and :func:`to_transformers` give a checkpoint back
as a PyTorch module, through ``wsctl export``: the names and layouts are wsctl's, never re-derived here."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import _wsctl
from .errors import RunFailedError, UnsupportedModelError
from .job import TrainingJob

#: The folder inside a pretrained model folder that holds its weights, as ``save_pretrained`` writes them.
WEIGHTS_FILE = "model.safetensors"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RunFailedError("this needs PyTorch: pip install 'weightstream[torch]'") from None
    return torch


def mlp_model(module: Any, sparsity: float = 0.0) -> dict[str, Any]:
    """``spec.model`` for a ``torch.nn.Sequential`` of ``Linear`` layers (with biases) separated by one kind of
    activation (``ReLU``, or ``GELU(approximate='tanh')``, weightstream's GELU), a leading ``Flatten`` allowed.
    Anything else raises :class:`UnsupportedModelError` naming the layer and what to use instead."""
    torch = _torch()
    nn = torch.nn
    if not isinstance(module, nn.Sequential):
        raise UnsupportedModelError(
            f"{type(module).__name__} is not a torch.nn.Sequential: from_torch takes a Sequential of Linear layers "
            "and activations, or a Hugging Face GPT-2/Llama (model, config or folder)"
        )
    widths: list[int] = []
    activation: str | None = None
    previous = "input"
    for i, layer in enumerate(module):
        where = f"layer {i} ({layer!r})"
        if isinstance(layer, nn.Flatten) and i == 0:
            continue
        if isinstance(layer, nn.Linear):
            if previous == "linear":
                raise UnsupportedModelError(f"{where} follows another Linear with no activation between: add one (ReLU or GELU)")
            if layer.bias is None:
                raise UnsupportedModelError(f"{where} has no bias: weightstream's MLP layers have one, use bias=True")
            if widths and widths[-1] != layer.in_features:
                raise UnsupportedModelError(f"{where} takes {layer.in_features} features but the layer before gives {widths[-1]}")
            if not widths:
                widths.append(layer.in_features)
            widths.append(layer.out_features)
            previous = "linear"
            continue
        if isinstance(layer, nn.ReLU):
            kind = "relu"
        elif isinstance(layer, nn.GELU):
            if layer.approximate != "tanh":
                raise UnsupportedModelError(
                    f"{where} is the exact GELU: weightstream's is the tanh approximation, use nn.GELU(approximate='tanh')"
                )
            kind = "gelu"
        else:
            raise UnsupportedModelError(
                f"{where} is not supported: an MLP job is Linear layers with ReLU or GELU(approximate='tanh') between them"
            )
        if previous != "linear":
            raise UnsupportedModelError(f"{where} does not follow a Linear: put one activation after each Linear but the last")
        if activation is not None and activation != kind:
            raise UnsupportedModelError(f"{where} mixes {kind} with {activation}: an MLP job uses one activation throughout")
        activation, previous = kind, "activation"
    if previous != "linear" or len(widths) < 2:
        raise UnsupportedModelError("the Sequential must end with a Linear layer (the logits), with at least one Linear")
    return {"kind": "mlp", "layers": widths, "activation": activation or "relu", "sparsity": sparsity}


def decoder_model(source: Any, save_to: str | Path | None = None) -> dict[str, Any]:
    """``spec.model`` for a Hugging Face decoder: a ``PreTrainedModel`` (saved to ``save_to``, a new temporary
    folder by default, and started from), a ``PretrainedConfig`` (shape only), or a folder (started from when
    it holds ``model.safetensors``). The shape is wsctl's reading of the config."""
    folder: Path
    weights = False
    if isinstance(source, (str, Path)):
        folder = Path(source)
        weights = (folder / WEIGHTS_FILE).is_file()
    elif hasattr(source, "save_pretrained") and hasattr(source, "config") and hasattr(source, "state_dict"):
        folder = Path(save_to) if save_to is not None else Path(tempfile.mkdtemp(prefix="weightstream-model-"))
        source.save_pretrained(folder, safe_serialization=True)
        weights = True
    elif hasattr(source, "to_dict") and hasattr(source, "model_type"):
        folder = Path(save_to) if save_to is not None else Path(tempfile.mkdtemp(prefix="weightstream-config-"))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(source.to_dict()))
    else:
        raise UnsupportedModelError(
            f"{type(source).__name__} is neither a torch.nn.Sequential nor a Hugging Face model, config or folder"
        )
    model = dict(_wsctl.run_json(["model", str(folder)]))
    if weights:
        model["from"] = str(folder)
    return model


def from_torch(
    module: Any,
    *,
    name: str,
    data: Mapping[str, Any],
    training: Mapping[str, Any],
    cs2: int = 1,
    sparsity: float = 0.0,
    save_to: str | Path | None = None,
    **spec: Any,
) -> TrainingJob:
    """A job training ``module``: a ``torch.nn.Sequential`` becomes an MLP job (its weights drawn from the job's
    seed, as every MLP job's), a Hugging Face GPT-2 or Llama model, config or folder a decoder job that starts
    from its weights where it has them. ``data``, ``training`` and any other ``spec`` field are the YAML's."""
    torch = _torch()
    hugging_face = isinstance(module, (str, Path)) or hasattr(module, "save_pretrained") or hasattr(module, "model_type")
    if isinstance(module, torch.nn.Module) and not hugging_face:
        model = mlp_model(module, sparsity)
    else:
        model = decoder_model(module, save_to)
        if sparsity:
            model["sparsity"] = sparsity
    return TrainingJob(name, cs2=cs2, model=model, data=dict(data), training=dict(training), **spec)


def _export(checkpoint: str | Path, fmt: str, out: str | Path | None, job: TrainingJob | None, tokenizer: str | Path | None) -> Path:
    target = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=f"weightstream-{fmt}-")) / "model"
    args = ["export", str(checkpoint), "--format", fmt, "--out", str(target)]
    with tempfile.TemporaryDirectory() as scratch:
        if job is not None:
            manifest = Path(scratch) / "job.yaml"
            job.save(manifest)
            args += ["--job", str(manifest)]
        if tokenizer is not None:
            args += ["--tokenizer", str(tokenizer)]
        _wsctl.run(args)
    return target


def to_torch(checkpoint: str | Path, job: TrainingJob | None = None, out: str | Path | None = None) -> Any:
    """The model of a checkpoint as PyTorch: an MLP as a ``torch.nn.Sequential`` computing exactly what the
    appliance evaluated; a GPT or Llama as its ``transformers`` model (see :func:`to_transformers`)."""
    torch = _torch()
    folder = _export(checkpoint, "safetensors", out, job, None)
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "weightstream-mlp" or config.get("model", {}).get("kind") != "mlp":
        return to_transformers(checkpoint, job=job)
    from safetensors.torch import load_file

    tensors = load_file(str(folder / WEIGHTS_FILE))
    widths = [int(w) for w in config["layers"]]
    activation = {"relu": lambda: torch.nn.ReLU(), "gelu": lambda: torch.nn.GELU(approximate="tanh")}[config["activation"]]
    layers: list[Any] = []
    for i in range(len(widths) - 1):
        linear = torch.nn.Linear(widths[i], widths[i + 1])
        with torch.no_grad():
            linear.weight.copy_(tensors[f"layers.{i}.weight"])
            linear.bias.copy_(tensors[f"layers.{i}.bias"])
        layers.append(linear)
        if i < len(widths) - 2:
            layers.append(activation())
    return torch.nn.Sequential(*layers).eval()


def to_transformers(
    checkpoint: str | Path,
    out: str | Path | None = None,
    job: TrainingJob | None = None,
    tokenizer: str | Path | None = None,
) -> Any:
    """A GPT or Llama checkpoint as a ``transformers`` model (``GPT2LMHeadModel`` or ``LlamaForCausalLM``), via
    ``wsctl export --format huggingface`` into ``out`` (a temporary folder by default), in eval mode."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise RunFailedError("to_transformers needs transformers: pip install transformers") from None
    folder = _export(checkpoint, "huggingface", out, job, tokenizer)
    return AutoModelForCausalLM.from_pretrained(str(folder)).eval()
