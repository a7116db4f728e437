"""What `transformers` computes for a Hugging Face model folder, for the tests that hold weightstream to it.

    python models/reference.py create-llama OUT_DIR    # a small random LlamaForCausalLM (GQA, untied head)
    python models/reference.py create-gpt2 OUT_DIR     # a small random GPT2LMHeadModel (untied head)
    python models/reference.py run < request.json      # losses, printed as JSON

A run request names the folder, windows to evaluate (each `inputs` and `labels`, token ids) and the batches
of training steps (AdamW, the same settings as the weightstream job: decoupled weight decay on matrices only,
never on vectors: biases and norm gains and biases). The model runs without dropout. It prints the mean loss per token of the evaluation windows before training and the
loss of every training step before its update, in float64 summed as float32 per window.
"""

import json
import pathlib
import shutil
import sys

import torch
import transformers


def create_llama(out: pathlib.Path) -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        # Gains away from 1, so a gain read in the wrong place shows.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    save(model, out)


def create_gpt2(out: pathlib.Path) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256,
        n_positions=48,
        n_embd=64,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        # Norm gains and every bias away from their starting values, so one read in the wrong place shows.
        for name, p in model.named_parameters():
            if name.endswith(".weight") and p.dim() == 1:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.uniform_(-0.2, 0.2)
    save(model, out)


def save(model, out: pathlib.Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def mean_loss(model, windows) -> torch.Tensor:
    total, count = 0.0, 0
    for w in windows:
        logits = model(torch.tensor([w["inputs"]])).logits[0]
        total = total + torch.nn.functional.cross_entropy(logits, torch.tensor(w["labels"]), reduction="sum")
        count += len(w["labels"])
    return total / count


def run(request: dict) -> dict:
    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32, attn_implementation="eager")
    # Gradients flow in eval mode too; it only turns dropout off, which the appliance does not have.
    model.eval()
    with torch.no_grad():
        eval_loss = mean_loss(model, request["eval"]).item()
    opt = request.get("optimizer", {})
    decay = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    adamw = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.get("weight_decay", 0.0)}, {"params": vectors, "weight_decay": 0.0}],
        lr=opt.get("learning_rate", 1e-3),
        betas=(opt.get("beta1", 0.9), opt.get("beta2", 0.999)),
        eps=opt.get("epsilon", 1e-8),
    )
    losses = []
    for batch in request.get("steps", []):
        adamw.zero_grad()
        loss = mean_loss(model, batch)
        loss.backward()
        adamw.step()
        losses.append(loss.item())
    return {"eval_loss": eval_loss, "step_losses": losses}


if __name__ == "__main__":
    if sys.argv[1] == "create-llama":
        create_llama(pathlib.Path(sys.argv[2]))
    elif sys.argv[1] == "create-gpt2":
        create_gpt2(pathlib.Path(sys.argv[2]))
    elif sys.argv[1] == "run":
        print(json.dumps(run(json.load(sys.stdin))))
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
