"""Larger than memory: weight streaming against training with the model resident, and against PyTorch eager.

Writes bench/RESULTS-larger.md and bench/results-larger.json from, in one run on this machine:
  1. the ~100M GPT (width 1024, 8 blocks, 16 heads, 2,048 tokens a step) three ways: in one process with the model
     resident on the engine; as processes with every layer streamed from MemoryX (executionMode
     weightStreaming); and streamed from 2 weight servers that hold a quarter of MemoryX's state in memory and
     the rest in their disk tiers; the engine on a CPU of its own (`--engine-cpus`, default the last CPU: the
     resident process there alone, the streaming runs' other roles on the other CPUs, as an appliance's hosts);
  2. the 1 B example (examples/jobs/gpt-1b.yaml, a quarter of its state in memory) at 4,096 tokens a step in one
     micro-batch against PyTorch eager training the same model in RAM on the engine's CPUs (as many threads),
     accumulating its gradients over 4 micro-batches (the most its RAM holds);
  3. with --with-3b, the 3 B example (examples/jobs/gpt-3b.yaml: 34 GiB of AdamW state on a 24 GiB machine, an
     eighth in memory, 2,048 tokens a step in one micro-batch; PyTorch cannot run it here) against what its
     compute alone would allow: the engines' FLOPs per step at the best GEMM rate of the engine's CPUs (`wsctl
     bench machine`, as many threads).
Every weightstream run has its engine on the same CPUs (`--engine-cpus`) and the other roles on the rest.
Configurations take turns within a round; medians over rounds. For each weightstream run: tokens/s, engines'
busy share, bytes each hop carried per step, the disk tier's MB/s against `wsctl bench machine`'s disk figures,
and every weight server's peak RSS against its budget plus the allowance the tier test grants (the process
before its slice, 48 MiB, four of its largest layer slices in transit), and for server 0, the coordinator's
process, the layers the plan says it holds in transit as the hub (`wsctl plan`).

    bash bench/run.sh --only-larger [--rounds N] [--skip-100m] [--skip-1b] [--with-3b] [--job JOB.yaml]
"""

import argparse
import json
import math
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (the bench's shared helpers: wsctl, the machine, the PyTorch GPT)
import torch_gpt  # noqa: E402

REPO, WORK, WSCTL, log = harness.REPO, harness.WORK / "larger", harness.WSCTL, harness.log

# The ~100M shape of the issue: the gpt-small example at width 1024, 16 heads, 8 blocks, 16 x 128 tokens.
SHAPE_100M = {"width": 1024, "heads": 16, "blocks": 8, "steps": 6, "warmupSteps": 2}
ONE_B = REPO / "examples/jobs/gpt-1b.yaml"
THREE_B = REPO / "examples/jobs/gpt-3b.yaml"


def field(text, name, cast):
    """The first `name:` value in a job's YAML text, through `cast`."""
    return cast(re.search(rf"^\s*{name}:\s*([^\s#]+)", text, re.M).group(1))


def with_fields(text, fields):
    """`text` with the first `name:` of each of `fields` set to its value; every one must be there."""
    for name, value in fields.items():
        text, n = re.subn(rf"^(\s*){name}:\s*[^\s#]+", rf"\g<1>{name}: {value}", text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"bench: no '{name}:' to set in the job")
    return text


def plan(path):
    """`wsctl plan --json` of the job at `path`: the Rust plan decides, the bench only reads it."""
    return harness.wsctl_json("plan", str(path), "--json")


def quarter_in_memory(text, servers, path):
    """`text` with MemoryX on `servers` weight servers, each holding a quarter of its slice in memory (never
    below what the plan needs in memory), written to `path`."""
    everything = 1 << 40  # first all of it in memory, to learn a slice's size
    text = re.sub(r"^spec:\n", f"spec:\n  memoryx:\n    servers: {servers}\n    memoryBytes: {everything}\n", text,
                  count=1, flags=re.M)
    path.write_text(text)
    p = plan(path)["memoryx"]
    budget = max(math.ceil(p["server_bytes"] / 4), p["min_memory_bytes"])
    text = text.replace(f"    memoryBytes: {everything}\n", f"    memoryBytes: {budget}\n", 1)
    path.write_text(text)
    return path


def jobs_100m(engine_cpus, job=None):
    """The three ~100M jobs: (name, path, wsctl run arguments); with `engine_cpus` (a CPU list), the engine runs on
    those CPUs and every other role on the rest, as on an appliance's own hosts, and the resident run (one
    process) on those CPUs alone: the engine has the same cores in every row. `job` (a job YAML) replaces the
    ~100M shape: its model, data and batch, run the same three ways."""
    if job is None:
        text = with_fields((REPO / "examples/jobs/gpt-small.yaml").read_text(), SHAPE_100M)
    else:
        text = job.read_text()
        if re.search(r"^\s*(executionMode|memoryx):", text, re.M):
            raise SystemExit(f"bench: {job} sets executionMode or memoryx itself; the bench sets both for its "
                             "three runs: take them out of the job")
    text = re.sub(r"^(\s*name:).*$", r"\1 gpt-100m", text, count=1, flags=re.M)
    resident = WORK / "gpt-100m-resident.yaml"
    resident.write_text(text)
    streamed = text.replace("spec:\n", "spec:\n  executionMode: weightStreaming\n", 1)
    streaming = WORK / "gpt-100m-streaming.yaml"
    streaming.write_text(streamed)
    tiered = quarter_in_memory(streamed, 2, WORK / "gpt-100m-tiered.yaml")
    pin = pin_args(engine_cpus)
    return [("resident, in process", resident, ["--in-process", *pin]),
            ("streaming every layer", streaming, pin),
            ("streaming, 1/4 in memory", tiered, pin)]


# The 1 B example at 4,096 tokens a step (its 1,024 as checked in do little work per streamed byte): 64 samples in
# one micro-batch, each streamed layer computing all 64 at once. The engine holds the whole batch's activations in
# its SRAM however the batch is cut (9.4 GiB at peak, as `wsctl plan` says: its SRAM is raised to 12 GiB). PyTorch
# cannot hold them beside the model's AdamW state in RAM: it accumulates its gradients over micro-batches of
# PYTORCH_MICRO_1B samples, the most that fit. Three steps, the first a warm-up.
FIELDS_1B = {"batchSize": 64, "microBatchSize": 64, "steps": 3, "sramBytes": 12 << 30}
PYTORCH_MICRO_1B = 16

# The 3 B example's 32 samples in one micro-batch, as the 1 B's: the engine's SRAM holds the batch's activations
# either way, and a streamed layer computes all 32 at once (2,048 tokens) instead of 8 products of 256.
FIELDS_3B = {"microBatchSize": 32}


def job_1b(engine_cpus):
    """The 1 B example (it already asks for a quarter of its state in memory) at FIELDS_1B's batch, its engine on
    `engine_cpus` (None: unpinned)."""
    text = with_fields(ONE_B.read_text(), FIELDS_1B)
    path = WORK / "gpt-1b-4096.yaml"
    path.write_text(text)
    return ("1 B streaming, 1/4 in memory", path, pin_args(engine_cpus))


def job_3b():
    """The 3 B example at FIELDS_3B."""
    path = WORK / "gpt-3b-one-micro-batch.yaml"
    path.write_text(with_fields(THREE_B.read_text(), FIELDS_3B))
    return path


def pin_args(engine_cpus):
    """`wsctl run`'s arguments putting the engines on `engine_cpus` and the other roles on the rest."""
    return ["--engine-cpus", engine_cpus] if engine_cpus else []


def cpu_set(engine_cpus):
    """The CPUs of a `--engine-cpus` list (`0-3,6`), or every CPU this process may use when it is None."""
    if not engine_cpus:
        return set(os.sched_getaffinity(0))
    cpus = set()
    for part in engine_cpus.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def weightstream(name, path, extra, warmup):
    """One `wsctl run`; per-step figures from metrics.jsonl after `warmup` steps, the rest from summary.json."""
    out = WORK / ("run-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"))
    shutil.rmtree(out, ignore_errors=True)
    log(f"weightstream: {name} ({path.name})")
    subprocess.run([str(WSCTL), "run", str(path), "--out", str(out), *extra], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return read_run(out, path, warmup)


def read_run(out, path, warmup):
    """The figures of the `wsctl run` of the job at `path` whose output folder is `out`."""
    text = path.read_text()
    batch, context = field(text, "batchSize", int), field(text, "contextLength", int)
    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    timed = metrics[warmup:] or metrics
    step_s = statistics.median(batch / m["samples_per_s"] for m in timed if m["samples_per_s"] > 0)
    steps = summary["steps"]
    servers = summary.get("memoryx", {}).get("servers", [])
    # Server 0 is the coordinator's process: it also holds the layers in transit the plan allows it.
    transit = harness.wsctl_json("plan", "--json", str(path))["coordinator_transit_bytes"]
    wall = summary["wall_s"]
    engines = summary.get("engines", [])
    return {
        "tokens_per_s": batch * context / step_s,
        "batch_tokens": batch * context,
        "step_s": step_s,
        "busy": summary.get("wse_utilization"),
        "final_loss": summary["final_loss"],
        "losses": [m["loss"] for m in metrics],
        "flops_per_step": sum(e["flops"] for e in engines) / steps,
        "peak_sram": max((e["peak_sram_bytes"] for e in engines), default=0),
        "sram_budget": min((e["sram_bytes"] for e in engines), default=0),
        "memoryx_to_swarmx_per_step": summary["bytes_streamed"] / steps,
        "engine_received_per_step": sum(e["bytes_received"] for e in engines) / steps,
        "engine_sent_per_step": sum(e["bytes_sent"] for e in engines) / steps,
        "tier_read_mb_s": sum(s["tierReadBytes"] for s in servers) / wall / 1e6,
        "tier_written_mb_s": sum(s["tierWrittenBytes"] for s in servers) / wall / 1e6,
        "servers": [{"index": s["index"], "peak_rss": s["peakRssBytes"], "budget": s["budgetBytes"],
                     "in_memory": s["memoryBytes"], "on_disk": s["diskBytes"],
                     "allowance": s["baselineRssBytes"] + (48 << 20) + 4 * s["largestLayerBytes"]
                     + (transit if s["index"] == 0 else 0)} for s in servers],
    }


def pytorch_1b(path, steps, cpus):
    """PyTorch eager on the job at `path`'s model and batch, its gradients accumulated over micro-batches of
    PYTORCH_MICRO_1B samples (the whole batch's activations beside the model's AdamW state would not fit in RAM),
    on the CPUs `cpus` with a thread each: the engine's."""
    text = path.read_text()
    cfg = {k: field(text, k, int) for k in ("width", "heads", "blocks", "contextLength", "batchSize", "mlpRatio",
                                            "seed")}
    log(f"PyTorch eager: the 1 B model, {steps} timed steps, on CPUs {sorted(cpus)}")
    args = dict(width=cfg["width"], heads=cfg["heads"], blocks=cfg["blocks"], context=cfg["contextLength"],
                batch=cfg["batchSize"], mlp_ratio=cfg["mlpRatio"], steps=steps, warmup=1,
                lr=field(text, "learningRate", float), weight_decay=field(text, "weightDecay", float),
                threads=len(cpus), seed=cfg["seed"], micro_batch=PYTORCH_MICRO_1B)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)  # the process started next, and every thread it starts, inherit it
    try:
        # A process of its own: the model's 16 GB are the machine's again when it ends (the 3 B run needs them).
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(torch_gpt.train, kwds=args)
    finally:
        os.sched_setaffinity(0, before)


def medians(runs):
    """Field-wise medians of the numeric fields of a configuration's runs (the first run's for the rest)."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and v is not None:
            out[k] = statistics.median(r[k] for r in runs)
    out["rounds"] = len(runs)
    out["tokens_per_s_by_round"] = [r["tokens_per_s"] for r in runs]  # the spread the median is taken over
    return out


def by_round(rows, ref_name):
    """Each round's tokens/s and its ratio to the reference's run in the same round: the spread under the
    medians (for results that kept them)."""
    ref = rows[ref_name].get("tokens_per_s_by_round")
    if not ref or len(ref) < 2:
        return []
    out = ["By round (tokens/s, and against the reference's run of the same round):", ""]
    for name, x in rows.items():
        runs = x.get("tokens_per_s_by_round")
        if not runs:  # a row from a run that did not keep its rounds
            continue
        cells = ", ".join(f"{t:.1f}" + ("" if name == ref_name else f" ({t / q:.3f}×)") for t, q in zip(runs, ref))
        out.append(f"- {name}: {cells}")
    return out + [""]


def gib(b):
    """Bytes as GiB, two decimals."""
    return f"{b / 2**30:.2f} GiB"


def render(r):
    """RESULTS-larger.md from the results: one table per model, each row against its section's reference."""
    lines = ["# Larger than memory", "",
             f"`bash bench/run.sh --only-larger`, {r['machine']['date_utc']}, on {r['machine']['cpu']} "
             f"({r['machine']['cores']} cores, {r['machine']['memory_gib']} GiB). Medians of {r['rounds']} "
             "interleaved rounds. Disk, from `wsctl bench machine`: write to fsync "
             f"{r['disk']['write_mb_s']:.0f} MB/s, read with the cache dropped {r['disk']['read_mb_s']:.0f} MB/s.", ""]
    lines += [f"{note}\n" for note in r.get("notes", [])]
    head = ("| run | tokens/s | vs reference | engines busy | MemoryX out + in a step | engine in / out a step "
            "| disk tier read / write | weight servers' peak RSS (budget) |")
    first = f"The GPT of `{r['job']}`" if r.get("job") else "The ~100M GPT"
    for title, section, ref_name in ((first, "100m", "resident, in process"),
                                     ("The 1 B example", "1b", "PyTorch eager, in RAM")):
        rows = r.get(section)
        if not rows:
            continue
        tokens = next((x["batch_tokens"] for x in rows.values() if "batch_tokens" in x), None)
        title = f"{title} ({int(tokens):,} tokens a step)" if tokens else title
        cpus = rows[ref_name].get("engine_cpus", r.get("engine_cpus") if section == "100m" else None)
        if section == "100m" and cpus:
            title += (f", the engine on CPU {cpus} (the resident run's whole process there; "
                      "MemoryX, SwarmX and the input workers on the others)")
        elif cpus:
            title += (f", the engine on CPU {cpus} (MemoryX and the input workers on the others), PyTorch on "
                      "the same CPUs")
        ref = rows[ref_name]["tokens_per_s"]
        lines += [f"## {title}", "", head, "|" + " --- |" * 8]
        for name, x in rows.items():
            ratio = x["tokens_per_s"] / ref
            if "busy" not in x:
                lines.append(f"| {name} | {x['tokens_per_s']:.1f} | {ratio:.2f}× | | | | | |")
                continue
            rss = ", ".join(f"{gib(s['peak_rss'])} ({gib(s['budget']) if s['budget'] else 'no budget'})"
                            for s in x["servers"]) or "—"
            limit = x.get("disk", r["disk"])  # a section merged from another run keeps that run's disk figures
            disk = "—" if not x["tier_read_mb_s"] else (f"{x['tier_read_mb_s']:.0f} / {x['tier_written_mb_s']:.0f} MB/s "
                    f"({100 * x['tier_read_mb_s'] / limit['read_mb_s']:.1f}% / "
                    f"{100 * x['tier_written_mb_s'] / limit['write_mb_s']:.1f}% of the disk)")
            lines.append(f"| {name} | {x['tokens_per_s']:.1f} | {ratio:.2f}× | {100 * x['busy']:.0f}% "
                         f"| {gib(x['memoryx_to_swarmx_per_step'])} | {gib(x['engine_received_per_step'])} / "
                         f"{gib(x['engine_sent_per_step'])} | {disk} | {rss} |")
        lines.append("")
        lines += by_round(rows, ref_name)
    if r.get("3b"):
        lines += render_3b(r["3b"], r)
    return "\n".join(lines)


def render_3b(x, r):
    """The 3 B section: the run against its compute alone, and every budget it ran within."""
    peak = x.get("gemm_flops_per_s", r["gemm_flops_per_s"])  # the peak measured beside the 3 B run
    threads = x.get("gemm_threads", harness.THREADS)
    where = f", the engine on CPU {x['engine_cpus']}" if x.get("engine_cpus") else ""
    alone = x["batch_tokens"] / (x["flops_per_step"] / peak)
    servers = ", ".join(f"{gib(s['peak_rss'])} ({gib(s['budget'])} + {gib(s['allowance'])})" for s in x["servers"])
    losses = " → ".join(f"{v:.4f}" for v in x["losses"])
    return [f"## The 3 B example (2,048 tokens a step, AdamW state larger than the machine's memory{where})", "",
            "| tokens/s | its compute alone | ratio | engines busy | step | MemoryX out + in a step "
            "| engine in / out a step | disk tier read / write | engine SRAM peak (budget) "
            "| weight servers' peak RSS (budget + allowance) |",
            "|" + " --- |" * 10,
            f"| {x['tokens_per_s']:.2f} | {alone:.2f} | {x['tokens_per_s'] / alone:.2f}× | {100 * x['busy']:.0f}% "
            f"| {x['step_s']:.0f} s | {gib(x['memoryx_to_swarmx_per_step'])} "
            f"| {gib(x['engine_received_per_step'])} / {gib(x['engine_sent_per_step'])} "
            f"| {x['tier_read_mb_s']:.0f} / {x['tier_written_mb_s']:.0f} MB/s "
            f"| {gib(x['peak_sram'])} ({gib(x['sram_budget'])}) | {servers} |", "",
            f"Its compute alone: {x['flops_per_step'] / 1e12:.1f} TFLOP a step (the engines' count) at "
            f"{peak / 1e9:.0f} GFLOP/s, the best {threads}-thread GEMM of `wsctl bench machine` (the engine's CPUs). "
            f"Loss by step: {losses}.", ""]


def machine_figures():
    """From `wsctl bench machine`: the disk's sequential write and read rates (MB/s) where the tiers are
    written, and the best GEMM FLOP/s by thread count."""
    WORK.mkdir(parents=True, exist_ok=True)
    m = harness.wsctl_json("bench", "machine", "--json", "--disk-dir", str(WORK))
    gemm = {g["threads"]: g["best"] for g in m["gemm_flops_per_s"]}
    return ({"write_mb_s": m["disk_write_bytes_per_s"]["median"] / 1e6,
             "read_mb_s": m["disk_read_bytes_per_s"]["median"] / 1e6}, gemm)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved rounds of the ~100M configurations (4: two rounds' runs differed by up to "
                    "7%% on this project's machines, more than the 5%% the streaming row is held to)")
    ap.add_argument("--rounds-1b", type=int, default=1, help="rounds of the 1 B pair (minutes each)")
    ap.add_argument("--skip-1b", action="store_true", help="not the 1 B pair")
    ap.add_argument("--skip-100m", action="store_true", help="not the ~100M shape")
    ap.add_argument("--with-3b", action="store_true",
                    help="also the 3 B example (15-60 min; ~40 GiB of scratch disk, removed after)")
    last = max(os.sched_getaffinity(0))
    ap.add_argument("--engine-cpus", default=str(last),
                    help="the engine's CPUs in every run (`wsctl run --engine-cpus`; default the last CPU, the other "
                         "roles on the rest; PyTorch's 1 B run on them too); 'none' runs them unpinned")
    ap.add_argument("--job", type=Path, help="a GPT job YAML to run the ~100M section's three ways instead of its "
                    "built-in shape (without its own executionMode or memoryx)")
    ap.add_argument("--out", type=Path, default=harness.BENCH)
    ap.add_argument("--from-json", type=Path, metavar="RESULTS_JSON", help="only write RESULTS-larger.md from it")
    a = ap.parse_args()
    # Made first: a run of many minutes must not end unable to write what it measured.
    a.out.mkdir(parents=True, exist_ok=True)
    if a.from_json:
        (a.out / "RESULTS-larger.md").write_text(render(json.loads(a.from_json.read_text())) + "\n")
        return
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    disk, gemm = machine_figures()
    engine_cpus = None if a.engine_cpus == "none" else a.engine_cpus
    threads = len(cpu_set(engine_cpus))
    if threads not in gemm:
        raise SystemExit(f"bench: `wsctl bench machine` measured no {threads}-thread GEMM (it did {sorted(gemm)})")
    r = {"machine": harness.machine_description(), "rounds": a.rounds, "disk": disk,
         "gemm_flops_per_s": gemm[threads], "gemm_threads": threads, "engine_cpus": engine_cpus,
         "job": str(a.job) if a.job else None}
    runs = {}
    for _ in range(0 if a.skip_100m else a.rounds):
        for name, path, extra in jobs_100m(engine_cpus, a.job):
            runs.setdefault(name, []).append(weightstream(name, path, extra, warmup=1))
    if runs:
        r["100m"] = {name: medians(v) for name, v in runs.items()}
    if not a.skip_1b:
        name, path, extra = job_1b(engine_cpus)
        steps = field(path.read_text(), "steps", int)
        pair = {}
        for _ in range(a.rounds_1b):
            pair.setdefault(name, []).append(weightstream(name, path, extra, warmup=1))
            pair.setdefault("PyTorch eager, in RAM", []).append(pytorch_1b(path, steps - 1, cpu_set(engine_cpus)))
        r["1b"] = {k: medians(v) for k, v in pair.items()}
        r["1b"]["PyTorch eager, in RAM"]["engine_cpus"] = engine_cpus
    if a.with_3b:
        r["3b"] = dict(weightstream("3 B streaming, 1/8 in memory", job_3b(), pin_args(engine_cpus), warmup=1),
                       gemm_flops_per_s=gemm[threads], gemm_threads=threads, engine_cpus=engine_cpus)
    (a.out / "results-larger.json").write_text(json.dumps(r, indent=1) + "\n")
    (a.out / "RESULTS-larger.md").write_text(render(r) + "\n")
    log(f"wrote {a.out / 'RESULTS-larger.md'}")


if __name__ == "__main__":
    main()
