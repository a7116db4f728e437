"""The GPT weightstream trains (runtime/src/model/mod.rs, ModelLayout::gpt), in PyTorch, for the bench.

Same shape and arithmetic as weightstream's: byte vocabulary, learned token and position embeddings,
pre-norm blocks with LayerNorm *without* affine parameters, biased QKV / output / MLP projections, tanh-GELU,
`scaled_dot_product_attention(is_causal=True)`, a final LayerNorm and a head tied to the token embedding, AdamW
with the job's learning rate, betas and weight decay, trained on windows of Moby-Dick. Used by harness.py; run
alone for a quick number:

    bench/.venv/bin/python bench/torch_gpt.py --width 256 --steps 30 [--compile] [--sparsity 0.9]
    bench/.venv/bin/python bench/torch_gpt.py --width 2048 --heads 16 --blocks 20 --context 64 --batch 16 \
        --steps 3 --warmup 1                                  # the 1 B example at 1,024 tokens a step

`--sparsity` multiplies every block matrix by a fixed 0/1 mask on every forward (what users do today for a
sparse model in PyTorch); the PyTorch baseline the targets name is the dense one.
"""

import argparse
import gzip
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent


class Linear(torch.nn.Module):
    """`nn.Linear` with GPT-2's initialisation, optionally masked to a fixed fraction of its weights."""

    def __init__(self, n_in, n_out, std, density, gen):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in, generator=gen) * std)
        self.bias = torch.nn.Parameter(torch.zeros(n_out))
        if density < 1.0:
            self.register_buffer("mask", (torch.rand(n_out, n_in, generator=gen) < density).float())
        else:
            self.mask = None

    def forward(self, x):
        w = self.weight if self.mask is None else self.weight * self.mask
        return F.linear(x, w, self.bias)


class Block(torch.nn.Module):
    def __init__(self, width, heads, hidden, std, residual_std, density, gen):
        super().__init__()
        self.heads = heads
        self.qkv = Linear(width, 3 * width, std, density, gen)
        self.proj = Linear(width, width, residual_std, density, gen)
        self.up = Linear(width, hidden, std, density, gen)
        self.down = Linear(hidden, width, residual_std, density, gen)

    def forward(self, x):
        b, t, d = x.shape
        h = F.layer_norm(x, (d,))
        q, k, v = self.qkv(h).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, t, d))
        h = F.layer_norm(x, (d,))
        return x + self.down(F.gelu(self.up(h), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, context, width, heads, blocks, mlp_ratio, sparsity, seed):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        density = 1.0 - sparsity
        std = 0.02 / math.sqrt(density)
        residual_std = std / math.sqrt(2 * blocks)
        self.tok = torch.nn.Parameter(torch.randn(vocab, width, generator=gen) * 0.02)
        self.pos = torch.nn.Parameter(torch.randn(context, width, generator=gen) * 0.02)
        self.blocks = torch.nn.ModuleList(
            Block(width, heads, mlp_ratio * width, std, residual_std, density, gen) for _ in range(blocks))

    def forward(self, idx):
        x = self.tok[idx] + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        x = F.layer_norm(x, (x.shape[-1],))
        return F.linear(x, self.tok)  # the tied head, no bias


def text_bytes():
    raw = gzip.decompress((REPO / "examples/data/moby-dick/moby-dick.txt.gz").read_bytes())
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def train(width=256, heads=4, blocks=4, context=128, batch=16, mlp_ratio=4, sparsity=0.0, steps=30, warmup=5,
          lr=0.002, weight_decay=0.01, beta2=0.99, threads=2, compile=False, seed=7, data=None, micro_batch=None):
    """Trains `warmup + steps` steps; returns the median and 10th-percentile step times of the timed steps,
    tokens/s at the median, and the last loss. `micro_batch` (dividing `batch`) runs each step as gradients
    accumulated over micro-batches of that many samples, what a PyTorch user does when a batch's activations do
    not fit in memory beside the model's state."""
    micro_batch = micro_batch or batch
    if batch % micro_batch:
        raise SystemExit(f"torch_gpt: a micro-batch of {micro_batch} does not divide the batch of {batch}")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    data = text_bytes() if data is None else data
    model = Gpt(256, context, width, heads, blocks, mlp_ratio, sparsity, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, beta2), weight_decay=weight_decay)
    step_fn = model
    if compile:
        step_fn = torch.compile(model)
    gen = torch.Generator().manual_seed(seed)
    times = []
    loss = torch.tensor(0.0)
    for step in range(warmup + steps):
        start = time.perf_counter()
        at = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
        window = torch.stack([data[a: a + context + 1] for a in at.tolist()])
        x, y = window[:, :-1], window[:, 1:]
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for part in range(0, batch, micro_batch):
            xs, ys = x[part: part + micro_batch], y[part: part + micro_batch]
            logits = step_fn(xs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys.reshape(-1)) * (micro_batch / batch)
            loss.backward()
            total += loss.item()
        loss = torch.tensor(total)
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    p10 = statistics.quantiles(times, n=10)[0] if len(times) > 1 else times[0]
    return {"step_s": step_s, "p10_s": p10, "tokens_per_s": batch * context / step_s, "final_loss": loss.item()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=None, help="gradients accumulated over micro-batches of this many samples")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 10 compiled, 5 eager)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sparsity", type=float, default=0.0)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    warmup = a.warmup if a.warmup is not None else (10 if a.compile else 5)
    r = train(width=a.width, heads=a.heads, blocks=a.blocks, context=a.context, batch=a.batch, steps=a.steps,
              threads=a.threads, sparsity=a.sparsity, compile=a.compile, warmup=warmup,
              micro_batch=a.micro_batch)
    print(r)


if __name__ == "__main__":
    main()
