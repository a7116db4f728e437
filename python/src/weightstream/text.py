"""Text from a language model without leaving Python: ``wsctl generate`` over a checkpoint a job wrote or a
Hugging Face Llama folder, MemoryX streaming the model to a local engine once per token as in training."""

from __future__ import annotations

from pathlib import Path

from . import _wsctl


def generate(
    model: str | Path,
    prompt: str,
    tokens: int = 40,
    *,
    temperature: float | None = None,
    seed: int = 0,
    tokenizer: str | Path | None = None,
    timeout: float | None = None,
) -> str:
    """The prompt and its continuation of at most ``tokens`` tokens, greedy unless ``temperature`` is given
    (sampled from ``seed``). ``model`` is a checkpoint (``RunResult.checkpoints()[-1]``) or a model folder; the
    tokenizer is the folder's, or that of the folder the job started from, unless ``tokenizer`` names one (a
    byte-level model needs none)."""
    # `--prompt=TEXT`, so a prompt starting with '-' is not read as a flag.
    args = ["generate", str(model), f"--prompt={prompt}", "--tokens", str(tokens), "--seed", str(seed)]
    if temperature is not None:
        args += ["--temperature", str(temperature)]
    if tokenizer is not None:
        args += ["--tokenizer", str(tokenizer)]
    return _wsctl.run(args, timeout=timeout).removesuffix("\n")
