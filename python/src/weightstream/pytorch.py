"""PyTorch models in and out. :func:`from_torch` turns a ``torch.nn.Sequential`` of ``Linear`` layers and one
kind of activation into an MLP job, and a Hugging Face GPT-2 or Llama (a model, its config, or a folder) into a
decoder job whose shape wsctl reads from the config (``wsctl model``); either starts from the model's own
weights (``spec.model.from``: a Hugging Face folder, or for an MLP the folder ``wsctl export --format
safetensors`` writes), and a tokenizer given goes with the model. :func:`to_torch` and :func:`to_transformers`
give a checkpoint back as a PyTorch module, through ``wsctl export``: the names and layouts are wsctl's, never
re-derived here."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import _wsctl
from .errors import InvalidJobError, RunFailedError, UnsupportedModelError
from .job import TrainingJob

#: The file of a model folder that describes the model.
CONFIG_FILE = "config.json"
#: The ``model_type`` of an MLP folder's ``config.json``, as ``wsctl export --format safetensors`` writes it.
MLP_MODEL_TYPE = "weightstream-mlp"
#: The file of a model folder that holds its weights, as ``save_pretrained`` and ``wsctl export`` write them.
WEIGHTS_FILE = "model.safetensors"
#: The file of a model folder that holds its tokenizer, which a job reading text then uses unless its data names
#: another.
TOKENIZER_FILE = "tokenizer.json"
#: The ``model_type`` of the ``config.json`` ``wsctl export`` writes for a program.
PROGRAM_MODEL_TYPE = "weightstream-program"
#: How a job from :func:`from_torch` starts: from the module's own weights, or drawn from ``spec.training.seed``.
INITS = ("module", "seed")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RunFailedError("this needs PyTorch: install the package with its torch extra, pip install './python[torch]'") from None
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


def mlp_folder(module: Any, folder: str | Path) -> Path:
    """Writes ``module`` (a Sequential :func:`mlp_model` takes) into ``folder`` as ``wsctl export --format
    safetensors`` writes an MLP, the names :func:`to_torch` reads back: ``model.safetensors`` with each Linear's
    ``layers.{i}.weight`` (outputs × inputs) and ``layers.{i}.bias`` in float32, and a ``config.json`` with the
    widths and the activation. A job whose ``spec.model.from`` names the folder starts from these weights."""
    torch = _torch()
    from safetensors.torch import save_file

    model = mlp_model(module)
    linears = [layer for layer in module if isinstance(layer, torch.nn.Linear)]
    tensors: dict[str, Any] = {}
    for i, linear in enumerate(linears):
        tensors[f"layers.{i}.weight"] = linear.weight.detach().to(device="cpu", dtype=torch.float32).contiguous()
        tensors[f"layers.{i}.bias"] = linear.bias.detach().to(device="cpu", dtype=torch.float32).contiguous()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_FILE))
    config = {"model_type": MLP_MODEL_TYPE, "layers": model["layers"], "activation": model["activation"]}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def _new_folder(save_to: str | Path | None, what: str) -> Path:
    folder = Path(save_to) if save_to is not None else Path(tempfile.mkdtemp(prefix=f"weightstream-{what}-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _decoder_folder(source: Any, save_to: str | Path | None, weights: bool) -> tuple[Path, bool, bool]:
    """The folder a Hugging Face decoder is read from, whether it has weights to start from, and whether it is
    this package's to write into (saved here) rather than the user's."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        return folder, weights and (folder / WEIGHTS_FILE).is_file(), False
    if hasattr(source, "save_pretrained") and hasattr(source, "config") and hasattr(source, "state_dict"):
        if not weights:
            return _decoder_folder(source.config, save_to, False)
        folder = _new_folder(save_to, "model")
        source.save_pretrained(folder, safe_serialization=True)
        return folder, True, True
    if hasattr(source, "to_dict") and hasattr(source, "model_type"):
        folder = _new_folder(save_to, "config")
        (folder / CONFIG_FILE).write_text(json.dumps(source.to_dict()))
        return folder, False, True
    raise UnsupportedModelError(
        f"{type(source).__name__} is neither a torch.nn.Sequential nor a Hugging Face model, config or folder"
    )


def decoder_model(source: Any, save_to: str | Path | None = None, weights: bool = True) -> dict[str, Any]:
    """``spec.model`` for a Hugging Face decoder: a ``PreTrainedModel`` (saved to ``save_to``, a new temporary
    folder by default, and started from), a ``PretrainedConfig`` (shape only), or a folder (started from when
    it holds ``model.safetensors``); with ``weights=False`` the shape alone. The shape is wsctl's reading of the
    config."""
    folder, has_weights, _ = _decoder_folder(source, save_to, weights)
    return _decoder_spec(folder, has_weights)


def _decoder_spec(folder: Path, has_weights: bool) -> dict[str, Any]:
    model = dict(_wsctl.run_json(["model", str(folder)]))
    if has_weights:
        model["from"] = str(folder)
    return model


def _tokenizer_file(path: str | Path) -> Path:
    """The ``tokenizer.json`` a path names: the file, or the one in the folder."""
    given = Path(path)
    found = given / TOKENIZER_FILE if given.is_dir() else given
    if not found.is_file():
        raise UnsupportedModelError(f"tokenizer {given} is neither a tokenizer.json file nor a folder holding one")
    return found


def save_tokenizer(tokenizer: Any, folder: str | Path) -> Path:
    """Writes ``tokenizer`` into ``folder`` as ``tokenizer.json`` and returns its path: a ``transformers``
    tokenizer (a fast one: its ``save_pretrained`` writes ``tokenizer.json``), a ``tokenizers.Tokenizer``, or a
    ``tokenizer.json`` file (or a folder holding one), copied."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / TOKENIZER_FILE
    if isinstance(tokenizer, (str, Path)):
        source = _tokenizer_file(tokenizer)
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
    elif hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(folder))
    elif hasattr(tokenizer, "save") and hasattr(tokenizer, "encode"):
        tokenizer.save(str(target))
    else:
        raise UnsupportedModelError(
            f"{type(tokenizer).__name__} is not a tokenizer: give a transformers tokenizer, a tokenizers.Tokenizer or "
            "the path of a tokenizer.json"
        )
    if not target.is_file():
        raise UnsupportedModelError(
            f"{type(tokenizer).__name__} wrote no {TOKENIZER_FILE} (a slow tokenizer): load it with "
            "AutoTokenizer.from_pretrained(..., use_fast=True), or give the path of its tokenizer.json"
        )
    return target


def from_torch(
    module: Any,
    *,
    name: str,
    data: Mapping[str, Any],
    training: Mapping[str, Any],
    cs2: int = 1,
    sparsity: float = 0.0,
    save_to: str | Path | None = None,
    tokenizer: Any = None,
    init: str = "module",
    example_input: Any = None,
    **spec: Any,
) -> TrainingJob:
    """A job training ``module`` from its own weights. A ``torch.nn.Sequential`` becomes an MLP job started from
    its Linear layers (written to ``save_to``, a new temporary folder by default, by :func:`mlp_folder`); a
    Hugging Face GPT-2 or Llama model (saved to ``save_to``), config (the shape only) or folder a decoder job,
    started from its weights where it has them. ``init="seed"`` takes the shape alone and draws the weights from
    ``spec.training.seed``, exactly as the same job written in YAML does.

    ``tokenizer`` (a ``transformers`` tokenizer, a ``tokenizers.Tokenizer`` or a ``tokenizer.json`` path) goes with
    a decoder: saved into the folder the job starts from as ``tokenizer.json``, which wsctl uses for text whose
    ``data`` names no tokenizer (as it does a pretrained folder's own); where the job starts from no folder of
    this package's (a config, your own folder, ``init="seed"``) it is named in ``data.tokenizer`` instead.
    With ``example_input`` (a ``(batch, tokens)`` tensor of token ids), any ``torch.nn.Module`` returning logits
    becomes a ``program`` job (as does a Hugging Face model of an architecture no preset runs, such as Qwen2,
    captured on sequences of ``context_length=`` tokens, by default its own up to 1,024): :func:`weightstream.program.capture` writes its graph and weights to ``save_to``,
    and wsctl reads the program, refusing with :class:`UnsupportedModelError` (the operation and the source line)
    what the appliance cannot run. It always starts from the module's own weights.

    ``data``, ``training`` and any other ``spec`` field are the YAML's."""
    torch = _torch()
    if example_input is not None:
        return _program_job(module, example_input, name=name, data=data, training=training, cs2=cs2,
                            sparsity=sparsity, save_to=save_to, tokenizer=tokenizer, init=init, **spec)
    if init not in INITS:
        raise InvalidJobError(
            f"init={init!r}: use 'module' (start from the model's own weights) or 'seed' (draw them from "
            "spec.training.seed, as the YAML job does)"
        )
    data = dict(data)
    if tokenizer is not None and data.get("tokenizer"):
        raise InvalidJobError(
            f"the tokenizer is given twice (tokenizer= and data.tokenizer {data['tokenizer']!r}): give it once"
        )
    hugging_face = isinstance(module, (str, Path)) or hasattr(module, "save_pretrained") or hasattr(module, "model_type")
    if isinstance(module, torch.nn.Module) and not hugging_face:
        if tokenizer is not None:
            raise UnsupportedModelError("tokenizer= is for a language model: an MLP reads features, not text")
        model = mlp_model(module, sparsity)
        if init == "module":
            model["from"] = str(mlp_folder(module, _new_folder(save_to, "mlp")))
    else:
        folder, has_weights, ours = _decoder_folder(module, save_to, init == "module")
        try:
            model = _decoder_spec(folder, has_weights)
        except InvalidJobError as refused:
            # An architecture no preset describes (Qwen2's Q/K/V biases, say) goes in as a program when the
            # model itself is at hand: captured on a batch of its own context.
            if not isinstance(module, torch.nn.Module) or init != "module" or "cannot run" not in refused.message:
                raise
            context = int(spec.pop("context_length", 0) or min(getattr(module.config, "max_position_embeddings", 0) or 1024, 1024))
            example = torch.zeros((2, context), dtype=torch.long)
            return _program_job(module, example, name=name, data=data, training=training, cs2=cs2, sparsity=sparsity,
                                save_to=folder, tokenizer=tokenizer, init=init, **spec)
        if sparsity:
            model["sparsity"] = sparsity
        if tokenizer is not None:
            if ours and has_weights:
                save_tokenizer(tokenizer, folder)  # The job's folder: wsctl passes it on to the data.
            elif isinstance(tokenizer, (str, Path)):
                data["tokenizer"] = str(_tokenizer_file(tokenizer))
            else:
                data["tokenizer"] = str(save_tokenizer(tokenizer, folder if ours else _new_folder(None, "tokenizer")))
    return TrainingJob(name, cs2=cs2, model=model, data=data, training=dict(training), **spec)


def _program_job(module: Any, example_input: Any, *, name: str, data: Mapping[str, Any], training: Mapping[str, Any],
                 cs2: int, sparsity: float, save_to: str | Path | None, tokenizer: Any, init: str,
                 **spec: Any) -> TrainingJob:
    from .program import capture

    if init != "module":
        raise InvalidJobError("init='seed' is for the built-in families: a program starts from its module's weights")
    folder = capture(module, example_input, _new_folder(save_to, "program"))
    model = dict(_wsctl.run_json(["model", str(folder)]))
    if sparsity:
        model["sparsity"] = sparsity
    data = dict(data)
    if tokenizer is not None:
        if data.get("tokenizer"):
            raise InvalidJobError("the tokenizer is given twice (tokenizer= and data.tokenizer): give it once")
        data["tokenizer"] = str(save_tokenizer(tokenizer, folder) if not isinstance(tokenizer, (str, Path))
                                else _tokenizer_file(tokenizer))
    return TrainingJob(name, cs2=cs2, model=model, data=data, training=dict(training), **spec)


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


def to_torch(checkpoint: str | Path, job: TrainingJob | None = None, out: str | Path | None = None,
             module: Any = None) -> Any:
    """The model of a checkpoint as PyTorch: an MLP as a ``torch.nn.Sequential`` computing exactly what the
    appliance evaluated; a GPT or Llama as its ``transformers`` model (see :func:`to_transformers`); a program
    (a job from ``from_torch(module, example_input=...)``) loaded into ``module``, your own instance of the
    module it was captured from, which is returned in eval mode."""
    torch = _torch()
    folder = _export(checkpoint, "safetensors", out, job, None)
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("model_type") == PROGRAM_MODEL_TYPE:
        return _load_program(folder, config, module)
    if config.get("model_type") != MLP_MODEL_TYPE or config.get("model", {}).get("kind") != "mlp":
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


def _load_program(folder: Path, config: Mapping[str, Any], module: Any) -> Any:
    from safetensors.torch import load_file

    if module is None:
        raise InvalidJobError(
            f"the checkpoint holds a program captured from {config.get('module') or 'a module'}: pass an instance of "
            "it, to_torch(checkpoint, module=...), to load the trained weights into"
        )
    tensors = load_file(str(folder / WEIGHTS_FILE))
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    if unexpected:
        raise InvalidJobError(f"{type(module).__name__} has no {', '.join(unexpected)}: pass the module the program was captured from")
    # A tied weight is written once, under the name the capture kept; its alias is the same parameter.
    state = module.state_dict(keep_vars=True)
    loaded = {id(state[k]) for k in tensors if k in state}
    parameters = dict(module.named_parameters(remove_duplicate=False))
    lacking = [n for n in missing if n in parameters and id(parameters[n]) not in loaded]
    if lacking:
        raise InvalidJobError(f"the checkpoint has no {', '.join(lacking)}: pass the module the program was captured from")
    return module.eval()


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
        raise RunFailedError(
            "to_transformers needs transformers: install the package with its torch extra, pip install './python[torch]'"
        ) from None
    folder = _export(checkpoint, "huggingface", out, job, tokenizer)
    return AutoModelForCausalLM.from_pretrained(str(folder)).eval()
