"""Capturing a ``torch.nn.Module`` as a model program: :func:`capture` runs ``torch.export`` on the module with an
example batch of token ids (its batch dimension left free) and writes what the export holds into a folder:
``program.json`` (every node of the graph, its arguments, output shape and source lines, and what each input of
the graph is) and ``model.safetensors`` (the parameters and buffers by their state-dict names). Nothing here
decides whether the appliance can run the program: ``wsctl`` reads the folder, maps it onto its operations and
refuses what it cannot run, naming the operation and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The file of a program folder that holds the captured graph.
PROGRAM_FILE = "program.json"
#: The file of a program folder that holds the module's parameters and buffers.
WEIGHTS_FILE = "model.safetensors"
#: The format ``program.json`` is written in; wsctl refuses others.
FORMAT = "weightstream-program/1"


def _arg(value: Any) -> Any:
    """One argument of a node as JSON: nodes by name, symbolic sizes by symbol, everything else as itself or its
    string (dtypes, devices, layouts, memory formats)."""
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, (list, tuple)):
        return [_arg(v) for v in value]
    if isinstance(value, torch.SymInt):
        return {"sym": str(value)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # JSON has no infinities: keep them as strings wsctl reads back.
        return value if value == value and abs(value) != float("inf") else {"float": str(value)}
    return {"repr": str(value)}


def _shape(val: Any) -> list[Any] | None:
    import torch

    if not isinstance(val, torch.Tensor):
        return None
    return [d if isinstance(d, int) else {"sym": str(d)} for d in val.shape]


def _node(node: Any) -> dict[str, Any]:
    val = node.meta.get("val")
    entry: dict[str, Any] = {
        "name": node.name,
        "kind": node.op,
        "target": str(node.target) if node.op == "call_function" else node.name,
        "args": _arg(list(node.args)),
        "kwargs": {k: _arg(v) for k, v in node.kwargs.items()},
        "shape": _shape(val),
        "dtype": str(val.dtype).removeprefix("torch.") if hasattr(val, "dtype") else None,
        "stack": node.meta.get("stack_trace"),
    }
    if isinstance(val, (list, tuple)):
        entry["shapes"] = [_shape(v) for v in val]
    return entry


def capture(module: Any, example_input: Any, folder: str | Path) -> Path:
    """Exports ``module`` called on ``example_input`` (a ``(batch, tokens)`` tensor of token ids) into ``folder``
    as ``program.json`` and ``model.safetensors``; returns the folder. The batch dimension is exported as free,
    so the appliance may run any number of sequences per engine."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    module = module.eval()
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    # A Hugging Face model returns its key/value cache beside the logits unless its config says not to.
    config = getattr(module, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache:
        config.use_cache = False
    try:
        exported = torch.export.export(module, (example_input,), dynamic_shapes=({0: batch},), strict=False)
    finally:
        if use_cache:
            config.use_cache = use_cache
    signature = exported.graph_signature
    inputs = []
    for spec in signature.input_specs:
        inputs.append({"name": spec.arg.name, "kind": spec.kind.name.lower(), "target": spec.target})
    outputs = [{"name": getattr(spec.arg, "name", None), "kind": spec.kind.name.lower()} for spec in signature.output_specs]
    program = {
        "format": FORMAT,
        "module": type(module).__name__,
        "example_input": list(example_input.shape),
        "inputs": inputs,
        "outputs": outputs,
        "nodes": [_node(n) for n in exported.graph.nodes],
    }
    tensors = {}
    for name, tensor in list(exported.state_dict.items()) + list(exported.constants.items()):
        if isinstance(tensor, torch.Tensor):
            tensors[name] = tensor.detach().to(torch.float32).contiguous().clone()
    save_file(tensors, str(folder / WEIGHTS_FILE))
    (folder / PROGRAM_FILE).write_text(json.dumps(program, indent=1))
    return folder
