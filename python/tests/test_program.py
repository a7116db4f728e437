"""Any decoder written as a plain torch.nn.Module goes in through from_torch(module, example_input=...): the
Qwen2-, GPT-J- and GPT-2-style examples of examples/programs/decoders.py are evaluated by the appliance as
PyTorch evaluates them, come back through to_torch(checkpoint, module=...) unchanged after a step at a learning
rate of 1e-12, train on 2 CS-2s, and a module using an operation the appliance lacks is refused naming it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import weightstream as ws

from conftest import REPO

sys.path.insert(0, str(REPO / "examples/programs"))
import decoders  # noqa: E402

TEXT = "examples/data/moby-dick/moby-dick.txt.gz"
CONTEXT = 32
SMALL = {
    "qwen": lambda: decoders.QwenStyle(vocab=256, width=64, heads=4, kv_heads=2, blocks=2, hidden=128, context=CONTEXT),
    "gptj": lambda: decoders.GptJStyle(vocab=256, width=64, heads=4, blocks=2, context=CONTEXT),
    "gpt2": lambda: decoders.Gpt2Style(vocab=256, width=64, heads=4, blocks=2, context=CONTEXT),
    "research": lambda: decoders.ResearchStyle(vocab=256, width=64, heads=4, blocks=2, context=CONTEXT),
    "nanogpt": lambda: decoders.NanoGptStyle(vocab=256, width=64, heads=4, blocks=2, context=CONTEXT),
}


def hugging_face(kind: str) -> torch.nn.Module:
    import transformers as t

    if kind == "hf-gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2))
    config = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=CONTEXT)
    if kind == "hf-qwen2":  # Biases on Q, K and V: no preset describes it.
        return t.Qwen2ForCausalLM(t.Qwen2Config(tie_word_embeddings=True, **config))
    return t.LlamaForCausalLM(t.LlamaConfig(tie_word_embeddings=False, **config))


def make(kind: str) -> torch.nn.Module:
    torch.manual_seed(3)
    return hugging_face(kind).eval() if kind.startswith("hf-") else SMALL[kind]()


def logits(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = module(ids)
    out = out[0] if isinstance(out, tuple) else out  # nanoGPT's (logits, loss)
    return getattr(out, "logits", out)


def example() -> torch.Tensor:
    return torch.randint(0, 256, (2, CONTEXT))


def held_out_file(tmp_path: Path, windows: int = 24) -> Path:
    """A held-out text of whole windows (and the one token the last window predicts)."""
    text = (REPO / "examples/data/moby-dick/held-out-1b.txt").read_bytes()
    path = tmp_path / "held-out.txt"
    path.write_bytes(text[: windows * CONTEXT + 1])
    return path


def torch_held_out_loss(module: torch.nn.Module, path: Path) -> float:
    """The mean next-token loss PyTorch gives over the file's windows, tiled without overlap."""
    ids = torch.tensor(list(path.read_bytes()))
    windows = (len(ids) - 1) // CONTEXT
    inputs = ids[: windows * CONTEXT].view(windows, CONTEXT)
    targets = ids[1 : windows * CONTEXT + 1].view(windows, CONTEXT)
    with torch.no_grad():
        scores = logits(module.eval(), inputs).double()
    return torch.nn.functional.cross_entropy(scores.reshape(-1, 256), targets.reshape(-1)).item()


@pytest.mark.parametrize("kind", ["qwen", "gptj", "gpt2", "research", "nanogpt", "hf-qwen2", "hf-llama", "hf-gpt2"])
def test_a_plain_module_is_evaluated_as_torch_evaluates_it_and_comes_back_unchanged(kind: str, tmp_path: Path) -> None:
    module = make(kind)
    held_out = held_out_file(tmp_path)
    training = {"batchSize": 4, "steps": 1, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 1e-12}}
    job = ws.from_torch(module, example_input=example(), name=f"py-{kind}-eval", training=training, cs2=2,
                        data={"kind": "text", "path": TEXT, "heldOutPath": str(held_out)},
                        save_to=tmp_path / "program", checkpoint={"intervalSteps": 1})
    assert (job.spec["model"]["kind"], job.spec["model"]["contextLength"]) == ("program", CONTEXT)
    result = job.run_local(out=tmp_path / "run", progress=False)
    theirs = torch_held_out_loss(module, held_out)
    print(f"{kind}: appliance {result.eval['loss']:.6f} torch {theirs:.6f}")
    assert result.eval["loss"] == pytest.approx(theirs, rel=1e-2), (result.eval["loss"], theirs)
    back = ws.to_torch(result.checkpoints()[-1], module=make(kind))
    for name, value in module.state_dict().items():
        assert torch.allclose(back.state_dict()[name], value, rtol=1e-5, atol=1e-6), name
    ids = example()
    with torch.no_grad():
        assert torch.allclose(logits(back, ids), logits(module, ids), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["qwen", "gptj", "research", "hf-qwen2"])
def test_a_plain_module_trains_on_two_cs2s_and_exports_back(kind: str, tmp_path: Path) -> None:
    module = make(kind)
    training = {"batchSize": 8, "steps": 40, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 3e-3}}
    job = ws.from_torch(module, example_input=example(), name=f"py-{kind}-train", training=training, cs2=2,
                        data={"kind": "text", "path": TEXT}, save_to=tmp_path / "program",
                        checkpoint={"intervalSteps": 40})
    result = job.run_local(out=tmp_path / "run", progress=False)
    losses = [m["loss"] for m in result.metrics]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    back = ws.to_torch(result.checkpoints()[-1], module=make(kind))
    moved = [n for n, v in back.state_dict().items() if not torch.equal(v, module.state_dict()[n])]
    assert moved, "training changed the weights"


def test_both_execution_modes_train_a_program_alike(tmp_path: Path) -> None:
    training = {"batchSize": 8, "steps": 6, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 3e-3}}
    curves = {}
    for mode in ("pipelined", "weightStreaming"):
        job = ws.from_torch(make("gpt2"), example_input=example(), name=f"py-gpt2-{mode.lower()}", training=training,
                            cs2=2, data={"kind": "text", "path": TEXT}, save_to=tmp_path / mode, executionMode=mode,
                            sparsity=0.5)
        curves[mode] = [m["loss"] for m in job.run_local(out=tmp_path / f"run-{mode}", progress=False).metrics]
    assert curves["pipelined"] == pytest.approx(curves["weightStreaming"], rel=1e-4), curves
    assert curves["pipelined"][-1] < curves["pipelined"][0]


def test_a_module_with_an_operation_the_appliance_lacks_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ws.UnsupportedModelError) as raised:
        ws.from_torch(decoders.WithFft(), example_input=example(), name="py-fft", training={"steps": 1},
                      data={"kind": "text", "path": TEXT}, save_to=tmp_path / "fft")
    message = raised.value.message
    assert "aten.fft_fft.default" in message and "decoders.py:" in message and "torch.fft.fft" in message, message


def test_to_torch_of_a_program_needs_the_module(tmp_path: Path) -> None:
    module = make("qwen")
    training = {"batchSize": 4, "steps": 1, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 1e-12}}
    job = ws.from_torch(module, example_input=example(), name="py-qwen-back", training=training,
                        data={"kind": "text", "path": TEXT}, save_to=tmp_path / "program",
                        checkpoint={"intervalSteps": 1})
    checkpoint = job.run_local(out=tmp_path / "run", in_process=True, progress=False).checkpoints()[-1]
    with pytest.raises(ws.InvalidJobError, match="QwenStyle"):
        ws.to_torch(checkpoint)
    with pytest.raises(ws.InvalidJobError, match="pass the module the program was captured from"):
        ws.to_torch(checkpoint, module=make("gptj"))


def test_a_hugging_face_model_no_preset_runs_comes_in_as_a_program(tmp_path: Path) -> None:
    module = make("hf-qwen2")
    training = {"batchSize": 4, "steps": 2, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 1e-12}}
    job = ws.from_torch(module, name="py-hf-qwen2", data={"kind": "text", "path": TEXT}, training=training,
                        save_to=tmp_path / "qwen2", checkpoint={"intervalSteps": 2})
    assert (job.spec["model"]["kind"], job.spec["model"]["contextLength"]) == ("program", CONTEXT)
    result = job.run_local(out=tmp_path / "run", in_process=True, progress=False)
    back = ws.to_torch(result.checkpoints()[-1], module=make("hf-qwen2"))
    ids = example()
    with torch.no_grad():
        assert torch.allclose(logits(back, ids), logits(module, ids), rtol=1e-4, atol=1e-5)
