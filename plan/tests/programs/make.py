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

def hugging_face(kind: str):
    import transformers as t

    common = dict(vocab_size=32, max_position_embeddings=8, use_cache=False)
    if kind == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2))
    config = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, **common)
    if kind == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(tie_word_embeddings=True, **config))
    return t.LlamaForCausalLM(t.LlamaConfig(tie_word_embeddings=False, **config))


SMALL = {
    "qwen": lambda: decoders.QwenStyle(vocab=32, width=16, heads=4, kv_heads=2, blocks=2, hidden=24, context=8),
    "gptj": lambda: decoders.GptJStyle(vocab=32, width=16, heads=2, blocks=2, context=8),
    "gpt2": lambda: decoders.Gpt2Style(vocab=32, width=16, heads=2, blocks=2, context=8),
    "research": lambda: decoders.ResearchStyle(vocab=32, width=16, heads=2, blocks=2, context=8),
    "fft": lambda: decoders.WithFft(vocab=32, width=16),
    "hf-qwen2": lambda: hugging_face("qwen2"),
    "hf-llama": lambda: hugging_face("llama"),
    "hf-gpt2": lambda: hugging_face("gpt2"),
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
    for node in program["nodes"]:  # The innermost frames are what the tests read; the rest only takes room.
        if node.get("stack"):
            node["stack"] = "\n".join(node["stack"].splitlines()[-6:])
    (folder / PROGRAM_FILE).write_text(json.dumps(program, separators=(",", ":")))
    if name == "fft":
        continue
    module.eval()  # No dropout: the appliance trains without it.
    logits = module(ids)
    logits = getattr(logits, "logits", logits)
    r = torch.randn_like(logits)
    (logits * r).sum().backward()
    ref = {"ids": ids.float(), "logits": logits.detach(), "r": r}
    for pname, p in module.named_parameters(remove_duplicate=False):
        ref[f"grad.{pname}"] = p.grad.detach().clone()
    save_file({k: v.contiguous() for k, v in ref.items()}, str(folder / "reference.safetensors"))
    print(name, "captured:", len(program["nodes"]), "nodes")
