"""Llama-shaped training, weightstream against PyTorch eager running `transformers`' LlamaForCausalLM, side by
side on the same threads, and reported as ratios (bench/RESULTS-llama.md, bench/results-llama.json).

The model: width 512, 8 query heads over 4 key/value heads, 4 blocks, SwiGLU of 1,408, an untied head over the
256 byte tokens, 128-token windows of Moby-Dick, 16 a step, AdamW. PyTorch trains it dense (its default
attention, scaled-dot-product); weightstream trains it in one process dense and 90% sparse (every attention and
MLP matrix masked). Rounds are interleaved and each figure is the median over rounds of the median step time
after warm-up.

    bash bench/run.sh --only-llama [--steps N] [--runs N]
"""

import argparse
import gzip
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import time

import torch
import transformers

REPO = pathlib.Path(__file__).resolve().parent.parent
WORK = REPO / "bench/.work"
WSCTL = REPO / "target/release/wsctl"
THREADS = 2
SHAPE = {"width": 512, "heads": 8, "kv_heads": 4, "blocks": 4, "intermediate": 1408, "context": 128, "batch": 16,
         "vocab": 256, "lr": 1e-3, "weight_decay": 0.01, "beta2": 0.95, "seed": 7}


def log(msg):
    print(f"[bench llama] {msg}", flush=True)


def job(sparsity, steps):
    s = SHAPE
    text = f"""apiVersion: weightstream.dev/v1beta1
kind: TrainingJob
metadata: {{name: bench-llama-s{int(100 * sparsity)}}}
spec:
  cs2: 1
  model: {{kind: llama, contextLength: {s['context']}, width: {s['width']}, heads: {s['heads']}, kvHeads: {s['kv_heads']}, blocks: {s['blocks']}, intermediateSize: {s['intermediate']}, tiedEmbeddings: false, sparsity: {sparsity}}}
  data: {{kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}}
  training:
    batchSize: {s['batch']}
    steps: {steps}
    seed: {s['seed']}
    optimizer: {{kind: adamw, learningRate: {s['lr']}, weightDecay: {s['weight_decay']}, beta2: {s['beta2']}}}
"""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"llama-s{int(100 * sparsity)}-{steps}.yaml"
    path.write_text(text)
    return path


def weightstream(sparsity, steps, warmup):
    path = job(sparsity, steps + warmup)
    out = WORK / f"run-{path.stem}"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([str(WSCTL), "run", str(path), "--out", str(out), "--in-process"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    times = [SHAPE["batch"] / m["samples_per_s"] for m in metrics[warmup:] if m["samples_per_s"] > 0]
    summary = json.loads((out / "summary.json").read_text())
    return {"step_s": statistics.median(times), "final_loss": summary["final_loss"]}


def pytorch(steps, warmup):
    s = SHAPE
    torch.set_num_threads(THREADS)
    torch.manual_seed(s["seed"])
    config = transformers.LlamaConfig(vocab_size=s["vocab"], hidden_size=s["width"], intermediate_size=s["intermediate"],
                                      num_hidden_layers=s["blocks"], num_attention_heads=s["heads"],
                                      num_key_value_heads=s["kv_heads"], max_position_embeddings=s["context"],
                                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = transformers.LlamaForCausalLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=s["weight_decay"], betas=(0.9, s["beta2"]))
    text = gzip.decompress((REPO / "examples/data/moby-dick/moby-dick.txt.gz").read_bytes())
    data = torch.tensor(list(text[: 4_000_000]), dtype=torch.long)
    gen = torch.Generator().manual_seed(s["seed"])
    times, loss = [], None
    for step in range(steps + warmup):
        starts = torch.randint(0, len(data) - s["context"] - 1, (s["batch"],), generator=gen)
        x = torch.stack([data[i: i + s["context"]] for i in starts])
        y = torch.stack([data[i + 1: i + s["context"] + 1] for i in starts])
        t0 = time.perf_counter()
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, s["vocab"]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times), "final_loss": loss.item()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--runs", type=int, default=2, help="interleaved rounds")
    args = ap.parse_args()
    if not WSCTL.exists():
        raise SystemExit(f"{WSCTL} is missing: run bench/run.sh, which builds it")
    tokens = SHAPE["batch"] * SHAPE["context"]
    configs = [("PyTorch eager (transformers LlamaForCausalLM), dense", lambda: pytorch(args.steps, 3)),
               ("weightstream in-process, dense", lambda: weightstream(0.0, args.steps, 5)),
               ("weightstream in-process, 90% sparse", lambda: weightstream(0.9, args.steps, 5))]
    per = {name: [] for name, _ in configs}
    for run in range(args.runs):
        for name, measure in configs:
            log(f"round {run + 1}/{args.runs}: {name}")
            per[name].append(measure())
    rows = [{"name": n, "step_s": statistics.median(r["step_s"] for r in rs),
             "tokens_per_s": statistics.median(tokens / r["step_s"] for r in rs),
             "runs_tokens_per_s": [tokens / r["step_s"] for r in rs], "final_loss": rs[-1]["final_loss"]} for n, rs in per.items()]
    eager = rows[0]["tokens_per_s"]
    result = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": THREADS, "shape": SHAPE,
              "steps": args.steps, "runs": args.runs, "load": [round(v, 1) for v in os.getloadavg()], "rows": rows,
              "torch": torch.__version__, "transformers": transformers.__version__,
              "ratios": {"dense": rows[1]["tokens_per_s"] / eager, "sparse": rows[2]["tokens_per_s"] / eager}}
    (REPO / "bench/results-llama.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# Llama-shaped training: weightstream against PyTorch eager", "",
             f"Measured {result['date_utc']} by `bash bench/run.sh --only-llama` ({args.runs} interleaved rounds of "
             f"{args.steps} timed steps; load average {result['load']} at the end; torch {torch.__version__}, "
             f"transformers {transformers.__version__}, {THREADS} threads each).", "",
             f"Model: width {SHAPE['width']}, {SHAPE['heads']} query heads over {SHAPE['kv_heads']} key/value heads, "
             f"{SHAPE['blocks']} blocks, SwiGLU {SHAPE['intermediate']}, untied head over 256 byte tokens; "
             f"{SHAPE['batch']} windows of {SHAPE['context']} tokens a step, AdamW.", "",
             "| configuration | step | tokens/s | vs PyTorch eager | each round (tokens/s) | final loss |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['name']} | {1000 * r['step_s']:.0f} ms | {r['tokens_per_s']:.0f} | "
                     f"{r['tokens_per_s'] / eager:.2f}x | {', '.join(f'{v:.0f}' for v in r['runs_tokens_per_s'])} | "
                     f"{r['final_loss']:.3f} |")
    lines += ["", f"Targets (#31): dense >= 1.2x: **{result['ratios']['dense']:.2f}x**; 90% sparse >= 3x PyTorch dense: "
              f"**{result['ratios']['sparse']:.2f}x**.", ""]
    (REPO / "bench/RESULTS-llama.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
