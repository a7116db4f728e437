"""PyTorch in and out: a Sequential starts a job from its own weights (or, with init="seed", is the YAML's MLP),
a Hugging Face decoder starts a job from its weights with its tokenizer, and a checkpoint comes back as a module
computing what the appliance evaluated."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import weightstream as ws
from weightstream import _wsctl

from conftest import REPO

FC_MNIST = REPO / "examples/jobs/fc-mnist.yaml"
SPIRALS = REPO / "examples/jobs/mlp-arrays.yaml"
TEXT = {"kind": "text", "path": "examples/data/moby-dick/moby-dick.txt.gz"}


def fc_mnist_module() -> torch.nn.Sequential:
    nn = torch.nn
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def test_a_torch_mlp_trains_to_the_same_held_out_accuracy_as_the_yaml_job(tmp_path: Path) -> None:
    yaml_job = ws.TrainingJob.from_yaml(FC_MNIST)
    spec = yaml_job.spec
    spec["training"].pop("epochs")
    spec["training"]["steps"] = 150
    job = ws.from_torch(
        fc_mnist_module(), name="fc-mnist", data=spec["data"], training=spec["training"], checkpoint=spec["checkpoint"], init="seed"
    )
    assert job.spec["model"] == {"kind": "mlp", "layers": [784, 512, 512, 10], "activation": "relu", "sparsity": 0.0}
    assert job.spec == spec
    ours = job.run_local(out=tmp_path / "torch", in_process=True, progress=False)
    theirs = yaml_job.run_local(out=tmp_path / "yaml", in_process=True, progress=False)
    assert ours.eval["accuracy"] == theirs.eval["accuracy"] > 0.85
    assert [m["loss"] for m in ours.metrics] == [m["loss"] for m in theirs.metrics]


def held_out_loss(module: torch.nn.Module) -> float:
    """The spirals' held-out loss of ``module`` computed by PyTorch."""
    held_out = load_file(str(REPO / "examples/data/spirals/test.safetensors"))
    with torch.no_grad():
        logits = module(held_out["inputs"].float()).double()
    return torch.nn.functional.cross_entropy(logits, held_out["labels"].long()).item()


def test_a_torch_mlp_starts_from_its_own_weights(tmp_path: Path) -> None:
    nn = torch.nn
    torch.manual_seed(5)
    module = nn.Sequential(nn.Linear(2, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 3))
    data = ws.TrainingJob.from_yaml(SPIRALS).spec["data"]
    # A learning rate too small to move a weight: the appliance evaluates the module as it came in.
    training = {"batchSize": 60, "steps": 1, "seed": 3, "optimizer": {"kind": "adamw", "learningRate": 1e-12}}
    job = ws.from_torch(module, name="py-own", data=data, training=training, save_to=tmp_path / "net", checkpoint={"intervalSteps": 1})
    assert job.spec["model"] == {"kind": "mlp", "layers": [2, 64, 64, 3], "activation": "gelu", "sparsity": 0.0, "from": str(tmp_path / "net")}
    result = job.run_local(out=tmp_path / "run", in_process=True, progress=False)
    theirs = held_out_loss(module)
    assert math.isclose(result.eval["loss"], theirs, rel_tol=1e-5), (result.eval["loss"], theirs)
    back = ws.to_torch(result.checkpoints()[-1])
    for (name, want), got in zip(module.state_dict().items(), back.state_dict().values()):
        assert torch.allclose(got, want, atol=1e-6), name
    # init="seed" takes the shape alone: the job draws its weights from its seed, as the YAML job does.
    seeded = ws.from_torch(module, name="py-seeded", data=data, training=training, init="seed")
    assert "from" not in seeded.spec["model"]
    drawn = seeded.run_local(out=tmp_path / "seeded", in_process=True, progress=False)
    assert not math.isclose(drawn.eval["loss"], theirs, rel_tol=1e-3)
    with pytest.raises(ws.InvalidJobError, match="init='pretrained'"):
        ws.from_torch(module, name="x", data=data, training=training, init="pretrained")


def test_to_torch_computes_what_the_appliance_evaluated(tmp_path: Path) -> None:
    job = ws.TrainingJob.from_yaml(SPIRALS)
    plan_steps = job.plan()  # Touches nothing; the job trains its 40 epochs.
    assert plan_steps["cs2"] == 1
    job.spec["checkpoint"] = {"intervalSteps": 100_000}  # Only the final checkpoint.
    result = job.run_local(out=tmp_path / "run", in_process=True, progress=False)
    module = ws.to_torch(result.checkpoints()[-1])
    assert isinstance(module, torch.nn.Sequential) and not module.training
    held_out = load_file(str(REPO / "examples/data/spirals/test.safetensors"))
    inputs, labels = held_out["inputs"].float(), held_out["labels"].long()
    with torch.no_grad():
        logits = module(inputs).double()
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    accuracy = (logits.argmax(dim=1) == labels).double().mean().item()
    assert result.eval["samples"] == len(labels)
    assert math.isclose(loss, result.eval["loss"], rel_tol=1e-5), (loss, result.eval["loss"])
    assert accuracy == pytest.approx(result.eval["accuracy"], abs=1e-12) and accuracy > 0.9


@pytest.mark.parametrize(
    ("layers", "named"),
    [
        (lambda nn: [nn.Linear(4, 8), nn.Conv1d(8, 8, 1), nn.Linear(8, 2)], "layer 1 (Conv1d"),
        (lambda nn: [nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 2)], "layer 1 (Dropout"),
        (lambda nn: [nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)], "nn.GELU(approximate='tanh')"),
        (lambda nn: [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.GELU("tanh"), nn.Linear(8, 2)], "mixes gelu with relu"),
        (lambda nn: [nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 2)], "layer 0 (Linear(in_features=4, out_features=8, bias=False)) has no bias"),
        (lambda nn: [nn.Linear(4, 8), nn.Linear(8, 2)], "no activation between"),
        (lambda nn: [nn.Linear(4, 8), nn.ReLU()], "must end with a Linear"),
    ],
)
def test_an_unsupported_module_is_one_error_naming_the_layer(layers, named: str) -> None:  # type: ignore[no-untyped-def]
    module = torch.nn.Sequential(*layers(torch.nn))
    with pytest.raises(ws.UnsupportedModelError) as raised:
        ws.from_torch(module, name="x", data={}, training={})
    assert named in raised.value.message, raised.value.message
    assert isinstance(raised.value, ws.InvalidJobError)
    with pytest.raises(ws.UnsupportedModelError, match="not a torch.nn.Sequential"):
        ws.from_torch(torch.nn.Linear(2, 2), name="x", data={}, training={})


def tiny_llama(vocab_size: int = 256) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def test_a_hugging_face_llama_comes_in_with_its_weights_and_goes_back_out(tmp_path: Path) -> None:
    original = tiny_llama()
    training = {"batchSize": 4, "steps": 2, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 1e-12}}
    job = ws.from_torch(original, name="py-llama", data=TEXT, training=training, save_to=tmp_path / "llama",
                        checkpoint={"intervalSteps": 2})
    model = job.spec["model"]
    assert (model["kind"], model["width"], model["kvHeads"], model["from"]) == ("llama", 32, 2, str(tmp_path / "llama"))
    assert model["contextLength"] == 64
    result = job.run_local(out=tmp_path / "run", in_process=True, progress=False)
    back = ws.to_transformers(result.checkpoints()[-1], out=tmp_path / "export")
    assert type(back).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([list(b"Call me Ishmael.")])
    with torch.no_grad():
        want, got = original(ids).logits, back(ids).logits
    # A learning rate of 1e-12 leaves the weights as they came in: the model went through the appliance whole.
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()


def test_a_trained_gpt2_gives_the_same_greedy_text_in_transformers_and_wsctl(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
    training = {"batchSize": 8, "steps": 30, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 3e-3}}
    job = ws.from_torch(gpt2, name="py-gpt2", data=TEXT, training=training, save_to=tmp_path / "gpt2",
                        checkpoint={"intervalSteps": 30})
    assert (job.spec["model"]["kind"], job.spec["model"]["layerNorm"]) == ("gpt", "affine")
    result = job.run_local(out=tmp_path / "run", in_process=True, progress=False)
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    checkpoint = result.checkpoints()[-1]
    back = ws.to_transformers(checkpoint, out=tmp_path / "export")
    prompt = "Call me Ishmael. "
    with torch.no_grad():
        out = back.generate(torch.tensor([list(prompt.encode())]), max_new_tokens=8, do_sample=False)
    theirs = bytes(out[0].tolist()).decode("utf-8", errors="replace")
    ours = _wsctl.run(["generate", str(checkpoint), "--prompt", prompt, "--tokens", "8"]).rstrip("\n")
    assert ours == theirs


def test_a_config_alone_gives_the_shape_and_no_weights(tmp_path: Path) -> None:
    from transformers import GPT2Config

    config = GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    job = ws.from_torch(config, name="py-config", data=TEXT, training={"batchSize": 8, "steps": 2, "optimizer": {"kind": "adamw", "learningRate": 1e-3}})
    model = job.spec["model"]
    assert "from" not in model
    assert (model["kind"], model["width"], model["heads"], model["blocks"], model["contextLength"]) == ("gpt", 32, 2, 2, 32)
    assert job.plan()["cs2"] == 1
    # A config weightstream cannot run is wsctl's refusal, typed.
    bad = GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2, activation_function="relu")
    with pytest.raises(ws.InvalidJobError, match="relu"):
        ws.from_torch(bad, name="py-bad", data=TEXT, training={})


def moby_tokenizer(vocab_size: int = 300):  # type: ignore[no-untyped-def]
    """A small byte-level BPE tokenizer (``tokenizers``) learnt from the first chapters of Moby-Dick."""
    import gzip

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    text = gzip.open(REPO / TEXT["path"], "rt").read()[:200_000]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


def test_a_model_given_with_its_tokenizer_reads_text_through_it(tmp_path: Path) -> None:
    tokenizer = moby_tokenizer()
    training = {"batchSize": 4, "steps": 2, "seed": 1, "optimizer": {"kind": "adamw", "learningRate": 1e-3}}
    job = ws.from_torch(tiny_llama(300), name="py-tok", data=TEXT, training=training, save_to=tmp_path / "llama",
                        tokenizer=tokenizer, checkpoint={"intervalSteps": 2})
    # Saved with the model, and passed on by wsctl to text that names no tokenizer.
    assert (tmp_path / "llama" / "tokenizer.json").is_file() and "tokenizer" not in job.spec["data"]
    result = job.run_local(out=tmp_path / "run", progress=False)
    # The job as the run's processes read it names the folder's tokenizer.
    ran = yaml.safe_load((tmp_path / "run" / "job.yaml").read_text())
    assert ran["spec"]["data"]["tokenizer"] == str(tmp_path / "llama" / "tokenizer.json")
    # wsctl generate reads the prompt and writes the text through it too (the checkpoint records the folder).
    text = ws.generate(result.checkpoints()[-1], "Call me Ishmael.", tokens=4)
    assert text.startswith("Call me Ishmael.") and len(text) > len("Call me Ishmael."), text
    # Without it, the same model is refused, naming the tokenizer, instead of training ids 0-255 on bytes.
    bare = ws.from_torch(tiny_llama(300), name="py-bare", data=TEXT, training=training, save_to=tmp_path / "bare")
    with pytest.raises(ws.InvalidJobError) as refused:
        bare.plan()
    assert "spec.data.tokenizer" in refused.value.message and "tokenizer.json" in refused.value.message


def test_a_tokenizer_comes_from_transformers_tokenizers_or_a_file(tmp_path: Path) -> None:
    from transformers import GPT2Config, PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=moby_tokenizer())
    training = {"batchSize": 4, "steps": 2, "optimizer": {"kind": "adamw", "learningRate": 1e-3}}
    job = ws.from_torch(tiny_llama(300), name="py-fast", data=TEXT, training=training, save_to=tmp_path / "fast", tokenizer=fast)
    assert (tmp_path / "fast" / "tokenizer.json").is_file()
    job.plan()
    # A config has no weights to start from: its tokenizer is named in the data.
    config = GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    shaped = ws.from_torch(config, name="py-shape", data=TEXT, training=training, save_to=tmp_path / "config",
                           tokenizer=tmp_path / "fast" / "tokenizer.json")
    assert shaped.spec["data"]["tokenizer"] == str(tmp_path / "fast" / "tokenizer.json")
    assert "from" not in shaped.spec["model"]
    shaped.plan()
    with pytest.raises(ws.InvalidJobError, match="given twice"):
        ws.from_torch(config, name="x", data={**TEXT, "tokenizer": "t.json"}, training=training, tokenizer=fast)
    with pytest.raises(ws.UnsupportedModelError, match="language model"):
        ws.from_torch(fc_mnist_module(), name="x", data={}, training={}, tokenizer=fast)
    with pytest.raises(ws.UnsupportedModelError, match="neither a tokenizer.json"):
        ws.from_torch(config, name="x", data=TEXT, training=training, tokenizer=tmp_path / "nowhere.json")
