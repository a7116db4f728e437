"""Decoders written as plain ``torch.nn.Module``s, as a researcher would write them, that no preset describes:
a Qwen2-style decoder (RMSNorm written out, Q/K/V biases, rotary positions by slices and ``cat``, grouped K/V
heads by ``repeat_interleave``, a SiLU-gated MLP), a GPT-J-style one (attention and MLP in parallel off one
LayerNorm, rotary positions, exact GELU, untied head with a bias) and a GPT-2-style one (learned positions, a
fused QKV split in three, attention written as matmul, mask and softmax). ``weightstream.from_torch`` takes
each of them with an example batch of token ids."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(head_dim: int, context: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(context).float(), inv_freq)
    both = torch.cat((angles, angles), dim=-1)
    return both.cos(), both.sin()


class QwenAttention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, context: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.q_proj = nn.Linear(width, heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(heads * self.head_dim, width, bias=False)
        cos, sin = rotary(self.head_dim, context)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class QwenBlock(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, hidden: int, context: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(width)
        self.self_attn = QwenAttention(width, heads, kv_heads, context)
        self.post_attention_layernorm = RMSNorm(width)
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class QwenStyle(nn.Module):
    """A Qwen2-style decoder: tied embeddings, biases on Q, K and V only."""

    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, kv_heads: int = 2, blocks: int = 2,
                 hidden: int = 128, context: int = 32) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(QwenBlock(width, heads, kv_heads, hidden, context) for _ in range(blocks))
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class GptJBlock(nn.Module):
    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.ln_1 = nn.LayerNorm(width)
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=False)
        self.out_proj = nn.Linear(width, width, bias=False)
        self.fc_in = nn.Linear(width, 4 * width)
        self.fc_out = nn.Linear(4 * width, width)
        cos, sin = rotary(self.head_dim, context)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.ln_1(x)
        q, k, v = (p(h).view(b, t, self.heads, self.head_dim).permute(0, 2, 1, 3)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q = q * self.cos[:t] + rotate_half(q) * self.sin[:t]
        k = k * self.cos[:t] + rotate_half(k) * self.sin[:t]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = self.out_proj(y.permute(0, 2, 1, 3).contiguous().view(b, t, c))
        mlp = self.fc_out(F.gelu(self.fc_in(h)))
        return x + attn + mlp


class GptJStyle(nn.Module):
    """A GPT-J-style decoder: parallel attention and MLP, an untied head with a bias."""

    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, blocks: int = 2, context: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.h = nn.ModuleList(GptJBlock(width, heads, context) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Gpt2Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).view(1, 1, context, context),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2Style(nn.Module):
    """A GPT-2-style decoder: learned positions, fused QKV, attention written out, tied head."""

    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, blocks: int = 2, context: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Gpt2Block(width, heads, context) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class ResearchBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.gain = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.w_in = nn.Parameter(torch.randn(width, 2 * width) / math.sqrt(width))
        self.w_out = nn.Linear(2 * width, width)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.gain + self.shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(c // self.heads)
        causal = torch.tril(torch.ones(t, t, device=x.device))
        scores = scores.masked_fill(causal == 0, float("-inf"))
        scores = (scores - scores.max(-1, keepdim=True).values).exp()  # softmax written out
        probs = scores / scores.sum(-1, keepdim=True)
        y = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, c)
        x = x + self.out(y)
        h = self.norm(x) @ self.w_in
        return x + self.w_out(torch.clamp(F.silu(h), -4.0, 4.0))


class ResearchStyle(nn.Module):
    """A research variant: a learned position table tiled over the batch, LayerNorm written out with var,
    attention by einsum over a tril mask with its softmax written out, Q/K/V unbound from one projection, an MLP
    weight applied as x @ W, a clamp, and outputs averaged from two heads."""

    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, blocks: int = 2, context: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(0.02 * torch.randn(1, context, width))
        self.blocks = nn.ModuleList(ResearchBlock(width, heads) for _ in range(blocks))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head_b = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.positions[:, : ids.shape[1]].repeat(ids.shape[0], 1, 1)
        for block in self.blocks:
            x = block(x)
        return torch.stack([self.head(x), self.head_b(x)], dim=0).mean(0)


class NanoGptStyle(nn.Module):
    """nanoGPT's calling convention: forward(idx, targets=None) returns (logits, loss), the loss None without
    targets; here its blocks are Gpt2Style's."""

    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, blocks: int = 2, context: int = 32) -> None:
        super().__init__()
        self.gpt = Gpt2Style(vocab, width, heads, blocks, context)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.gpt(idx)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


class WithFft(nn.Module):
    """A module the appliance refuses: its mixing layer is a Fourier transform (FNet)."""

    def __init__(self, vocab: int = 256, width: int = 64) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        x = x + torch.fft.fft(x, dim=-1).real
        return self.head(x)
