"""Writes the captured programs the Rust tests read: each example decoder of examples/programs/decoders.py,
small, captured by weightstream.program.capture, with a reference.safetensors beside it holding what PyTorch
computes for one batch: the token ids, the logits, a fixed upstream gradient `r` of the logits and the gradient
of sum(logits · r) with respect to every parameter. Run from the repository root with the models venv:
models/.venv/bin/python plan/tests/programs/make.py"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "python" / "src"), str(ROOT / "examples" / "programs")]
import decoders  # noqa: E402
from weightstream.program import PROGRAM_FILE, capture  # noqa: E402

SMALL = {
    "qwen": lambda: decoders.QwenStyle(vocab=32, width=16, heads=4, kv_heads=2, blocks=2, hidden=24, context=8),
    "gptj": lambda: decoders.GptJStyle(vocab=32, width=16, heads=2, blocks=2, context=8),
    "gpt2": lambda: decoders.Gpt2Style(vocab=32, width=16, heads=2, blocks=2, context=8),
    "fft": lambda: decoders.WithFft(vocab=32, width=16),
}

for name, make in SMALL.items():
    torch.manual_seed(7)
    module = make()
    with torch.no_grad():  # Biases and gains away from their initial 0 and 1, so the tests see them used.
        for p in module.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, 32, (3, 8))
    folder = Path(__file__).parent / name
    try:
        capture(module, ids, folder)
    except Exception as e:  # The FFT model's capture may fail in newer PyTorch; then it is skipped.
        print(name, "not captured:", e)
        continue
    program = json.loads((folder / PROGRAM_FILE).read_text())
    (folder / PROGRAM_FILE).write_text(json.dumps(program, separators=(",", ":")))
    if name == "fft":
        continue
    module.train()
    logits = module(ids)
    r = torch.randn_like(logits)
    (logits * r).sum().backward()
    ref = {"ids": ids.float(), "logits": logits.detach(), "r": r}
    for pname, p in module.named_parameters(remove_duplicate=False):
        ref[f"grad.{pname}"] = p.grad.detach().clone()
    save_file({k: v.contiguous() for k, v in ref.items()}, str(folder / "reference.safetensors"))
    print(name, "captured:", len(program["nodes"]), "nodes")
