"""Write the example notebooks from the Python sources below and execute them.

    python notebooks/build_notebooks.py            # write + execute all, save with outputs
    python notebooks/build_notebooks.py 03         # only notebooks whose name contains "03"
    python notebooks/build_notebooks.py --no-exec  # write without running

The notebooks are committed *with* their outputs so they read well on a code host;
``tests/test_notebooks.py`` re-executes them so they never rot, and checks that the committed
cells match the sources here. Notebooks use only the public API (``perfmodel``, ``search``,
``sweep``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
SETUP = """\
%matplotlib inline
import warnings

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

warnings.filterwarnings("ignore", category=DeprecationWarning)
pd.set_option("display.width", 140)
pd.set_option("display.max_columns", 30)
pd.set_option("display.precision", 4)"""


def md(text: str) -> tuple[str, str]:
    return ("md", text.strip("\n"))


def code(text: str) -> tuple[str, str]:
    return ("code", text.strip("\n"))


# =============================================================================================
NOTEBOOKS: dict[str, list[tuple[str, str]]] = {}

NOTEBOOKS["01_quickstart"] = [
    md("""
# 1. Quickstart: one configuration, its breakdown, and a published run

Load a model and a cluster from the shipped presets, predict one parallel configuration, look at
where the step time and the memory go, and check the model against a published measurement.
"""),
    code(SETUP),
    code("""
from perfmodel.spec.specs import load_cluster, load_model, load_training
from perfmodel.core.units import fmt_bytes, fmt_count
from search import evaluate_config

model = load_model("gpt3-175b")
cluster = load_cluster("dgx-a100-80g", gpus=1024)
training = load_training(global_batch_size=1536, seq_len=2048, precision="bf16")
print(f"{model.name}: {fmt_count(model.param_count())} parameters, {model.num_layers} layers")
print(f"{cluster.name}: {cluster.total_gpus} x {cluster.gpu.name}, "
      f"{fmt_bytes(cluster.gpu.hbm_bytes)} HBM each")
"""),
    md("""
One configuration: tensor parallel 8 inside a node, 16 pipeline stages with the interleaved
schedule (3 chunks per stage), data parallel 8, selective recompute and sequence parallelism, as in
Korthikanti et al. 2022. `evaluate_config` returns a `SearchResult`; `best` is a one-row DataFrame
with units in the column names.
"""),
    code("""
r = evaluate_config(model, cluster, training, tp=8, pp=16, vp=3, micro_batch_size=1,
                    zero_stage=1, recompute="selective", sequence_parallel=True,
                    framework="ideal")
r.best[["dp", "tp", "pp", "vp", "num_microbatches", "step_time_s", "tokens_per_s", "mfu",
        "peak_memory_bytes", "fits"]]
"""),
    code("""
# the breakdown as tables: seconds per step-time term, bytes per memory term (share of HBM)
for kind, rows in r.breakdown().items():
    if kind == "comm":
        continue
    unit = "s" if kind == "time" else "bytes"
    print(pd.DataFrame(rows, columns=["term", unit, "share"]).to_string(index=False), "\\n")
"""),
    md("""
The same for a few configurations at once: `perfmodel.step.evaluate.evaluate` takes a `ConfigBatch`
(struct of arrays) and returns a `StepResult` whose `to_frame()` is a DataFrame. The plots take a
`StepResult`, a `SearchResult` or a DataFrame.
"""),
    code("""
from perfmodel.parallel.config import ConfigBatch
from perfmodel.step.evaluate import evaluate
from plots.figures import plot_memory_breakdown, plot_time_breakdown

batch = ConfigBatch.from_arrays(
    dp=[8, 16, 8, 4], tp=[8, 8, 8, 8], pp=[16, 8, 16, 32], vp=[3, 1, 1, 1],
    schedule=["interleaved", "1f1b", "1f1b", "1f1b"], zero_stage=1, micro_batch_size=1,
    recompute=["selective", "selective", "full", "selective"], sequence_parallel=True,
    num_microbatches=[192, 96, 192, 384])
res = evaluate(model, training, cluster, batch)
res.to_frame()[["dp", "tp", "pp", "vp", "recompute", "step_time_s", "mfu", "bubble_time_s",
                "dp_comm_time_s", "peak_memory_bytes", "fits"]]
"""),
    code("plot_time_breakdown(res, title='GPT-3 175B on 1024 A100: step-time breakdown')"),
    code("plot_memory_breakdown(res, cluster.gpu.hbm_bytes)"),
    md("""
## Check one number against a published run

`hardware_specs/validation/training_runs_dev.csv` row R0085: NVIDIA NeMo 24.07 performance
summary, Llama-2 7B pre-training on 8 H100 (one DGX H100), FP8, global batch 128, sequence 4096,
tp = pp = 1, data parallel 8 with the distributed optimizer; published 16,934 tokens/s per GPU.
"""),
    code("""
from hardware_specs import ROOT

runs = pd.read_csv(ROOT / "validation" / "training_runs_dev.csv").set_index("row_id")
pub = runs.loc["R0085"]
print(pub["source"], "|", pub["model"], "|", pub["num_gpus"], "GPUs |", pub["precision"])

llama = evaluate_config("llama2-7b", "dgx-h100", gpus=8, global_batch_size=128, seq_len=4096,
                        precision="fp8", tp=1, pp=1, zero_stage=1, micro_batch_size=1)
pred = llama.best.iloc[0]
published = float(pub["tokens_per_sec_per_gpu"])
predicted = pred["tokens_per_s"] / 8
print(f"tokens/s per GPU: published {published:,.0f}, predicted {predicted:,.0f} "
      f"({predicted / published - 1:+.1%}); MFU predicted {pred['mfu']:.1%}")
"""),
    md("""
Notebook 5 repeats this check for every expressible row of the file.
"""),
]

# =============================================================================================
NOTEBOOKS["02_search"] = [
    md("""
# 2. Search: top configurations and the Pareto front

`search.plan` enumerates every valid parallel configuration (dp, tp, pp, vp, cp, ZeRO stage,
micro-batch, recompute, sequence parallelism, schedule), evaluates them all in one vectorized call,
and ranks them. A small space keeps this notebook fast: GPT-3 1.3B on up to 16 A100s.
"""),
    code(SETUP),
    code("""
from search import plan

r = plan("gpt3-1.3b", "dgx-a100-80g", gpus=16, global_batch_size=64, seq_len=2048, top=8,
         framework="ideal")
print(r.stats())
cols = ["dp", "tp", "pp", "vp", "zero_stage", "micro_batch_size", "recompute", "schedule",
        "step_time_s", "mfu", "peak_memory_bytes"]
r.top[cols]
"""),
    code("""
# why does each runner-up rank below the best?  and what does the best one flag?
for i in range(1, 4):
    print(i, r.explain(i))
print([d.message for d in r.diagnostics] or "no diagnostics for the best configuration")
"""),
    md("""
## Pareto front: step time versus peak memory versus GPU count

With `allow_idle_gpus=True` the search may use fewer than the 16 GPUs, so the GPU count becomes a
third objective. The exhaustive grid gives the exact front; NSGA-II (pymoo) samples the same space
and should land on (or next to) it with far fewer evaluations.
"""),
    code("""
exhaustive = plan("gpt3-1.3b", "dgx-a100-80g", gpus=16, global_batch_size=64,
                  allow_idle_gpus=True, strategy="grid")
nsga = plan("gpt3-1.3b", "dgx-a100-80g", gpus=16, global_batch_size=64,
            allow_idle_gpus=True, strategy="nsga2", seed=0)
keys = ["dp", "tp", "pp", "vp", "cp", "zero_stage", "micro_batch_size", "recompute",
        "sequence_parallel", "schedule"]
on_front = nsga.pareto.merge(exhaustive.pareto[keys].drop_duplicates(), on=keys).shape[0]
print(f"exhaustive: {exhaustive.evaluated} configurations evaluated, {len(exhaustive.pareto)} on "
      f"the front; NSGA-II: {nsga.evaluated} evaluated, {len(nsga.pareto)} on its front, "
      f"{on_front} of them on the exact front")
"""),
    code("""
from plots.figures import plot_pareto_front

plot_pareto_front(exhaustive, nsga, labels=["exhaustive (grid)", "NSGA-II"],
                  title="GPT-3 1.3B, global batch 64, up to 16 A100: colour = GPUs used")
"""),
    code("""
exhaustive.pareto[["gpus", "dp", "tp", "pp", "zero_stage", "micro_batch_size", "recompute",
                   "step_time_s", "peak_memory_bytes"]].head(10)
"""),
    md("""
## Scaling curve

The best configuration at each GPU count (one `plan` per count; ZeRO-1 pinned to keep it small).
"""),
    code("""
from plots.figures import plot_scaling_curve, scaling_frame

scaling = scaling_frame("gpt3-1.3b", "dgx-a100-80g", [8, 16, 32, 64, 128],
                        global_batch_size=256, zero_stage=1, framework="ideal")
display(scaling)
plot_scaling_curve("gpt3-1.3b", "dgx-a100-80g", None, frame=scaling)
"""),
    md("""
## A mixture-of-experts model: expert parallelism

For MoE models the search adds expert parallel `ep` and expert tensor parallel `etp` (experts laid
out as `etp x ep x expert-dp` on the attention's GPUs). Qwen3-30B-A3B (128 experts, top-8) on one
DGX H100 node: every configuration pays the token dispatch all-to-all (`ep_comm`), and more `ep`
shards the expert weights further (docs/moe.md).
"""),
    code("""
moe = plan("qwen3-30b-a3b", "dgx-h100", gpus=8, global_batch_size=256, seq_len=4096,
           precision="bf16", zero_stage=1, top=5)
moe.top[["dp", "tp", "pp", "ep", "etp", "micro_batch_size", "recompute", "step_time_s",
         "ep_comm_time_s", "mfu", "weights_memory_bytes", "peak_memory_bytes"]]
"""),
]

# =============================================================================================
NOTEBOOKS["03_pipeline"] = [
    md("""
# 3. Pipeline schedules: GPipe, 1F1B, interleaved and zero-bubble

The same model, the same 4 stages and 8 micro-batches under four schedules, simulated op by op
(`perfmodel.pipeline.schedules.simulate`), then the bubble share against the number of micro-batches.
"""),
    code(SETUP),
    code("""
from perfmodel.compute import layer as compute
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import load_cluster, load_model, load_training

model = load_model("gpt3-1.3b")            # 24 layers -> 6 per stage
training = load_training(global_batch_size=64, seq_len=2048)
gpu = load_cluster("dgx-a100-80g").gpu
p, m = 4, 8
ct = compute.compute_times(model, training, gpu,
                           ConfigBatch.from_arrays(pp=p, num_microbatches=m))
per_stage = model.num_layers // p
fwd = np.full(p, per_stage * ct["layer_fwd_s"][0])
bwd = np.full(p, per_stage * ct["layer_bwd_s"][0])
fwd[0] += ct["embed_fwd_s"][0]; bwd[0] += ct["embed_bwd_s"][0]       # embedding on stage 0
fwd[-1] += ct["logits_fwd_s"][0]; bwd[-1] += ct["logits_bwd_s"][0]   # logits + loss last
pd.DataFrame({"forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3},
             index=[f"stage {s}" for s in range(p)])
"""),
    code("""
from perfmodel.pipeline.schedules import simulate
from plots.figures import plot_pipeline_timeline

schedules = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)]
timelines = {s: simulate(fwd, bwd, m, s, v=v, p2p_s=20e-6) for s, v in schedules}
fig = Figure(figsize=(12, 10))
axes = fig.subplots(len(schedules), 1)
for ax, (s, _) in zip(axes, schedules):
    plot_pipeline_timeline(timelines[s], ax=ax)
longest_ms = max(tl.makespan_s for tl in timelines.values()) * 1e3
for ax in axes:
    ax.set_xlim(0, longest_ms)  # one time axis for all four
for ax in axes[:-1]:
    ax.set_xlabel("")
    ax.get_legend().remove()
fig.tight_layout(h_pad=1.5)
fig
"""),
    code("""
pd.DataFrame([{"schedule": s, "makespan_ms": tl.makespan_s * 1e3,
               "bubble": tl.bubble_fraction,
               "peak in-flight micro-batches (stage 0)": tl.peak_inflight[0],
               "peak held (stage 0, incl. deferred W)": tl.peak_held[0]}
              for s, tl in timelines.items()])
"""),
    md("""
GPipe and 1F1B have the same makespan and bubble, `(p-1)/(m+p-1)`; 1F1B only lowers the memory
(stage 0 holds `p` micro-batches instead of `m`). Interleaving divides the bubble by `v`; ZB-H1
fills it with deferred weight-gradient work (Qi et al. 2024).

## Bubble share versus micro-batch count
"""),
    code("""
from perfmodel.pipeline.schedules import bubble_fraction, pipeline_efficiency

ms = np.arange(1, 129)
P = 8
fig = Figure(figsize=(7, 4))
ax = fig.add_subplot()
for s, v in schedules:
    mm = ms[ms % P == 0] if s == "interleaved" else ms
    ax.plot(mm, bubble_fraction(P, mm, s, v=v) * 100, label=f"{s}" + (f" (v={v})" if v > 1 else ""))
ax.axvline(P - 1, color="gray", linestyle=":")
ax.annotate("textbook 'M* = P-1'", (P - 1, 50), xytext=(12, 60), fontsize=8,
            arrowprops={"arrowstyle": "->"})
ax.set_xscale("log", base=2)
ax.set_xlabel("micro-batches per step m")
ax.set_ylabel("bubble [% of the step]")
ax.set_title(f"p = {P} stages, uniform stage times")
ax.legend(frameon=False)
ax.grid(alpha=0.3)
fig
"""),
    md("""
### Why the textbook's "M* = P-1, maximum efficiency 0.5" is wrong

The efficiency of GPipe / 1F1B is `m / (m + p - 1)`. It *rises monotonically* in `m` towards 1;
0.5 is its value at `m = p - 1`, not a maximum:
"""),
    code("""
for mm in (P - 1, 2 * P, 32, 256):
    print(f"p = {P}, m = {mm:3d}: efficiency {float(pipeline_efficiency(P, mm)):.1%}")
"""),
    md("""
What does limit `m` is the global batch (`m = B / (dp * b)`): with `B` fixed, more micro-batches
means *smaller* ones, and a smaller micro-batch runs its GEMMs less efficiently, and, for GPipe,
activation memory (`m` micro-batches in flight). The full step model shows the trade-off:
"""),
    code("""
from perfmodel.step.evaluate import evaluate

cluster = load_cluster("dgx-a100-80g", gpus=8)
b = np.array([1, 2, 4, 8, 16])
tr = load_training(global_batch_size=128, seq_len=2048)
rows = []
for sched in ("gpipe", "1f1b"):
    batch = ConfigBatch.from_arrays(dp=1, tp=1, pp=8, micro_batch_size=b,
                                    num_microbatches=128 // b, schedule=sched)
    res = evaluate(model, tr, cluster, batch)
    for i in range(len(b)):
        rows.append({"schedule": sched, "micro_batch": b[i], "m": 128 // b[i],
                     "step_time_s": res.step_time_s[i], "bubble_share":
                     res.time_s["bubble"][i] / res.step_time_s[i],
                     "peak_memory_GiB": res.memory_bytes["peak"][i] / 2**30,
                     "fits": res.fits[i]})
pd.DataFrame(rows)
"""),
]

# =============================================================================================
NOTEBOOKS["04_collectives"] = [
    md("""
# 4. All-reduce: ring versus tree versus hierarchical

Alpha-beta model (`perfmodel.hardware.collectives`): ring `2(n-1)a + 2(n-1)/n S/B`, double binary tree
`2 ceil(log2 n) a + 2 S/B`, hierarchical = reduce-scatter inside each scale-up domain, all-reduce
of the shard across domains, all-gather inside. The group is placed on the cluster's link tiers by
`perfmodel.parallel.topology.group_placement`. Filled dots mark where the fastest algorithm changes.
"""),
    code(SETUP),
    code("""
from perfmodel.hardware.collectives import all_reduce_time
from plots.figures import allreduce_crossovers, allreduce_frame, plot_allreduce_vs_size

# the textbook's exercise 9.1 as a sanity check: 175e9 fp16 parameters, 8 GPUs, 100 GB/s ring
print(f"{float(all_reduce_time(175e9 * 2, 8, 100e9)):.3f} s")
"""),
    md("## 64 GPUs on DGX H100 (NVLink4 inside a node, 400 Gb/s InfiniBand per GPU)"),
    code("plot_allreduce_vs_size('dgx-h100', n=64)"),
    code("""
xo = allreduce_crossovers(allreduce_frame("dgx-h100", n=64))
xo.assign(size=xo["size_bytes"].map(lambda v: f"{v / 2**20:,.2f} MiB"))
"""),
    md("## 64 GPUs on A100 nodes over one 100 Gb/s Ethernet port per node"),
    code("plot_allreduce_vs_size('ethernet-a100', n=64)"),
    code("""
xo = allreduce_crossovers(allreduce_frame("ethernet-a100", n=64))
xo.assign(size=xo["size_bytes"].map(lambda v: f"{v / 2**20:,.2f} MiB"))
"""),
    md("""
Reading the two plots:

* Small messages are latency bound: the tree's `2 log2 n` steps beat the ring's `2(n-1)`.
* Large messages are bandwidth bound: the ring moves `2(n-1)/n S` per GPU against the tree's
  `2 S` (NCCL's tree runs at half the bus bandwidth), so the ring wins in the end.
* Hierarchical pays off when the network between nodes is much slower than NVLink (Ethernet):
  only the `1/n_intra` shard crosses the slow links. On DGX H100, where each GPU has its own
  400 Gb/s NIC and a flat ring runs over all of them, the flat algorithms win at large sizes.
"""),
    code("""
# one table: time of a 1 GiB gradient all-reduce on both clusters
pd.DataFrame({name: allreduce_frame(name, [2**30], n=64).iloc[0, 1:4]
              for name in ("dgx-h100", "ethernet-a100")})
"""),
]

# =============================================================================================
NOTEBOOKS["05_validation"] = [
    md("""
# 5. Validation: predicted versus published

Every row of `hardware_specs/validation/training_runs_dev.csv` (the development split of published
Megatron-LM, Korthikanti et al. and NeMo training runs) that the tool can express is predicted from
the row's own model, cluster and parallel configuration; nothing is fitted per row.
"""),
    code(SETUP),
    code("""
from validation.validate import summary, training_runs_report

report, skipped = training_runs_report()
print(summary(report))
report[["row_id", "model", "gpus", "config", "measured_s", "predicted_s", "error"]]
"""),
    code("""
from plots.figures import plot_validation_scatter

plot_validation_scatter(report, color_by="reliability")
"""),
    code("skipped  # rows the tool cannot express, with the reason"),
    md("""
## Single-GPU H200: eager PyTorch steps

`hardware_specs/calibration/h200/e2e_dev.csv` holds whole training steps of GPT models measured on
one H200 with plain eager PyTorch (bf16 autocast, fp32 AdamW; see that folder's README). The same
public API predicts them with `kernels="eager"`.
"""),
    code("""
from hardware_specs import ROOT
from perfmodel.parallel.config import ConfigBatch
from perfmodel.spec.specs import ModelSpec, load_cluster, load_training
from perfmodel.step.evaluate import evaluate

e2e = pd.read_csv(ROOT / "calibration" / "h200" / "e2e_dev.csv")
h200 = load_cluster("dgx-h200", gpus=1)
rows = []
for _, r in e2e.iterrows():
    m = ModelSpec(name=r["name"], num_layers=int(r["layers"]), hidden_size=int(r["hidden"]),
                  num_attention_heads=int(r["heads"]), ffn_hidden_size=4 * int(r["hidden"]),
                  vocab_size=int(r["vocab"]), max_seq_len=int(r["seq"]))
    tr = load_training(global_batch_size=int(r["micro_batch"]), seq_len=int(r["seq"]),
                       precision="bf16", optimizer="adamw")
    b = ConfigBatch.from_arrays(micro_batch_size=int(r["micro_batch"]), num_microbatches=1,
                                recompute=2 * int(r["recompute"]))
    res = evaluate(m, tr, h200, b, kernels="eager")
    rows.append({"row_id": f"{r['name']} b{r['micro_batch']}" + (" rc" if r["recompute"] else ""),
                 "status": r["status"], "measured_s": r["step_seconds"],
                 "predicted_s": res.step_time_s[0],
                 "measured_peak_GiB": r["peak_alloc_gib"],
                 "predicted_peak_GiB": res.memory_bytes["peak"][0] / 2**30,
                 "predicted_fits": bool(res.fits[0])})
h = pd.DataFrame(rows)
h["time_error"] = h["predicted_s"] / h["measured_s"] - 1
h["memory_error"] = h["predicted_peak_GiB"] / h["measured_peak_GiB"] - 1
h
"""),
    code("""
ok = h[h["status"] == "ok"]
print(f"step time: mean |error| {ok['time_error'].abs().mean():.1%} over {len(ok)} runs; "
      f"peak memory: mean |error| {ok['memory_error'].abs().mean():.1%}")
print("measured OOM predicted not to fit:",
      (~h.loc[h["status"] == "oom", "predicted_fits"]).all())
plot_validation_scatter(ok, color_by=None, title="single H200, eager PyTorch: step time")
"""),
]

# =============================================================================================
NOTEBOOKS["06_exercises"] = [
    md("""
# 6. The textbook's exercises 9.1-9.6, worked with the API

Chapter 9 of the seed textbook ends with exercises; here each is answered with the package's
functions, with the formula and its source. Where the chapter's text is wrong, the primary paper
is followed (see `docs/*.md`, "Where the seed text is wrong").
"""),
    code(SETUP),
    md("""
## 9.1 Ring all-reduce of 175B fp16 parameters on 8 GPUs at 100 GB/s

Ring all-reduce = reduce-scatter + all-gather: each GPU sends and receives `2(n-1)/n * S`
bytes (Thakur et al. 2005; NCCL-tests `PERFORMANCE.md`). `S = 175e9 * 2` bytes.
"""),
    code("""
from perfmodel.hardware.collectives import all_reduce_time

S = 175e9 * 2
t = float(all_reduce_time(S, 8, 100e9))
print(f"bandwidth term: 2 * 7/8 * {S:.3g} B / 100e9 B/s = {t:.3f} s")
print(f"with 5 us per step (14 steps): {float(all_reduce_time(S, 8, 100e9, 5e-6)):.6f} s")
"""),
    md("""
**6.125 s** (latency is negligible at this size). In practice gradients are reduced in buckets
overlapped with the backward pass, so much of it is hidden (notebook 1's `dp_comm` term).

## 9.2 GPipe bubble: 48 layers on 8 GPUs, 32 micro-batches

Bubble share of the step `(p-1)/(m+p-1)` (Huang et al. 2019); the 48 layers only set the stage
size (6 layers each) and do not enter the share.
"""),
    code("""
from perfmodel.pipeline.schedules import bubble_fraction, simulate

bf = float(bubble_fraction(8, 32, "gpipe"))
tl = simulate(np.full(8, 6 * 1.0), np.full(8, 6 * 2.0), 32, "gpipe")  # 6 layers per stage
print(f"(p-1)/(m+p-1) = 7/39 = {bf:.4f};  simulated: {tl.bubble_fraction:.4f}")
print(f"relative to the ideal time: (p-1)/m = 7/32 = {7 / 32:.4f}")
"""),
    md("""
**17.9 %** of the step is bubble (21.9 % overhead on top of the bubble-free time).

## 9.3 ZeRO-2, 16 GPUs, 70B parameters in FP32 with Adam: minimum memory per GPU

All-fp32 training keeps 4 bytes of weights, 4 of gradients and 8 of Adam moments (m, v) per
parameter (no separate master copy). ZeRO-2 shards gradients and optimizer states over the
`N_d = 16` data-parallel GPUs, weights stay replicated (Rajbhandari et al. 2020, Sec. 5.1-5.2):
`4 Psi + (4 + 8) Psi / N_d`.
"""),
    code("""
from perfmodel.memory.breakdown import model_state_bytes

psi = 70e9
got = float(model_state_bytes(psi, 16, 2, "fp32", "adam"))
print(f"4*Psi + 12*Psi/16 = {4 * psi / 1e9:.0f} GB + {12 * psi / 16 / 1e9:.1f} GB = "
      f"{got / 1e9:.1f} GB = {got / 2**30:.1f} GiB per GPU (model states only)")
for stage in (0, 1, 2, 3):
    print(f"  ZeRO-{stage}: {float(model_state_bytes(psi, 16, stage, 'fp32', 'adam')) / 1e9:7.1f} GB")
print(f"mixed precision (bf16 + fp32 master, 16 B/param), ZeRO-2: "
      f"{float(model_state_bytes(psi, 16, 2, 'bf16', 'adam')) / 1e9:.1f} GB")
"""),
    md("""
**332.5 GB (309.7 GiB)** per GPU for the model states alone, before activations: it does not fit
an 80 GB GPU. ZeRO-3 (also shards the weights) brings it to 70 GB; in practice 70B models are
trained with mixed precision plus tensor/pipeline parallelism.

## 9.4 Dynamic programming for pipeline partition points

Minimise the *slowest* stage (a pipeline runs at the pace of its bottleneck). With prefix sums
`C`: `D[1][i] = C[i]`, `D[j][i] = min_{k<i} max(D[j-1][k], C[i] - C[k])`, `O(P L^2)`.
The chapter's recurrence *adds* stage costs, which is the same for every split. Example: the
embedding on the first stage and a heavy logits layer on the last, costs from the compute model.
"""),
    code("""
from perfmodel.compute import layer as compute
from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.layers import partition_layers
from perfmodel.spec.specs import load_cluster, load_model, load_training

model = load_model("llama3.1-8b")          # 128k vocabulary: a heavy output layer
tr = load_training(global_batch_size=32, seq_len=8192)
ct = compute.compute_times(model, tr, load_cluster("dgx-h100").gpu,
                           ConfigBatch.from_arrays(pp=4, num_microbatches=32))
layer = ct["layer_fwd_s"][0] + ct["layer_bwd_s"][0]
costs = np.r_[ct["embed_fwd_s"][0] + ct["embed_bwd_s"][0], np.full(model.num_layers, layer),
              ct["logits_fwd_s"][0] + ct["logits_bwd_s"][0]]   # embedding, layers, logits
bounds, bottleneck = partition_layers(costs, 4)
even = np.r_[0, 1 + np.arange(1, 4) * model.num_layers // 4, len(costs)]
even_stage = [costs[a:b].sum() for a, b in zip(even[:-1], even[1:])]
print("units: embedding, 32 layers, logits; layer =", f"{layer * 1e3:.2f} ms, logits =",
      f"{costs[-1] * 1e3:.2f} ms")
print("even split (8 layers each): stage times [ms]", np.round(np.array(even_stage) * 1e3, 1))
print("DP split boundaries", [int(x) for x in bounds], "stage times [ms]",
      np.round([costs[a:b].sum() * 1e3 for a, b in zip(bounds[:-1], bounds[1:])], 1))
print(f"bottleneck: even {max(even_stage) * 1e3:.1f} ms -> DP {bottleneck * 1e3:.1f} ms")
"""),
    md("""
## 9.5 Communication volume of 3D parallelism

Per GPU of an inner stage, ZeRO-0, no recompute, `w` bytes per gradient, `a` per activation
(docs/communication.md):

`V = 2(N_d-1)/N_d * M/(N_m N_p) * w + 8 (N_m-1)/N_m * (B/N_d) S H (L/N_p) * a + 2 (B/N_d) S H * a`

(DP ring all-reduce of the stage's gradients; TP: 4 all-reduces of `(B/N_d) S H` per layer
and step, 2 forward + 2 backward (Shoeybi et al. 2019); PP: one activation send forward and one
gradient send backward per sequence.) Compare with `comm_bytes_per_gpu`:
"""),
    code("""
from perfmodel.comm.comm_volume import comm_bytes_per_gpu

model = load_model("gpt3-175b")
tr = load_training(global_batch_size=1536, seq_len=2048, precision="bf16")
Nd, Nm, Np = 16, 8, 8
batch = ConfigBatch.from_arrays(dp=Nd, tp=Nm, pp=Np, micro_batch_size=1,
                                num_microbatches=1536 // Nd)
api = comm_bytes_per_gpu(model, tr, batch)
B, S, H, L, M, w, a = 1536, 2048, model.hidden_size, model.num_layers, model.param_count(), 2, 2
formula = {"dp": 2 * (Nd - 1) / Nd * M / (Nm * Np) * w,
           "tp": 8 * (Nm - 1) / Nm * (B / Nd) * S * H * (L / Np) * a,
           "pp": 2 * (B / Nd) * S * H * a}
pd.DataFrame({"formula_GiB": {k: v / 2**30 for k, v in formula.items()},
              "api_GiB": {k: float(api[k][0]) / 2**30 for k in formula}})
"""),
    md("""
The DP term differs by the embedding parameters (the API counts the largest stage, which holds
the embedding); the TP term dominates (hundreds of GiB per step), which is why tensor parallelism
stays inside the NVLink domain. Summed over all `N` GPUs:
`V_total = 2(N_d-1) M w + 8(N_m-1) B S H L a + 2 N_m (N_p-1) B S H a`.

## 9.6 Real-time placement: perception, planning, control on 2 GPUs + 2 edge TPUs

The exercise names no parts; `hardware_specs/realtime/exercise_9_6.toml` documents the chosen
devices (NVIDIA L4, Coral Edge TPU) and models. `plan_realtime` enumerates placements
(exclusive devices, layer splits across devices), computes each model's response time under
fixed-priority scheduling, and checks deadlines and the end-to-end chain.
"""),
    code("""
from hardware_specs import ROOT
from realtime.placement import plan_realtime

rt = plan_realtime(ROOT / "realtime" / "exercise_9_6.toml")
print("feasible:", rt.feasible, "|", rt.binding)
rt.to_frame()
"""),
    code("""
print("compile-time checklist:")
for item in rt.checklist:
    print(" -", item)
bad = plan_realtime(ROOT / "realtime" / "exercise_9_6_infeasible.toml")
print("\\ninfeasible variant:", bad.feasible, "|", bad.reason or bad.binding)
print("degraded mode drops:", bad.degraded_drops)
"""),
    md("""
Control (10 ms) gets a device to itself at the highest priority, planning and perception the
GPUs; the chain perception -> planning -> control also has to fit its end-to-end deadline, which
is the binding constraint here.
"""),
]


# =============================================================================================
NOTEBOOKS["07_time_to_train"] = [
    md("""
# 7. Time to train: days, GPU-hours, energy, cost, interruptions and goodput

A step time is only the start. `plan(..., train_tokens=...)` adds the whole run: how many days,
GPU-hours, MWh and (with a price) money, how many job interruptions to expect at the cluster's
failure rate, the checkpoint interval (Daly 2006) and the goodput, the share of the wall time
spent on training that is kept. Every default (interruption rate, storage bandwidth, restart,
power, PUE) is a named constant of `perfmodel.run` with its source.
"""),
    code(SETUP),
    code("""
from search import plan

r = plan("llama3.1-8b", "dgx-h100", gpus=256, global_batch_size=512, seq_len=8192,
         tp=8, pp=1, cp=1, vp=1, zero_stage=1, micro_batch_size=1, recompute="selective",
         sequence_parallel=True, train_tokens=1e12, gpu_hour_price=2.0)
pd.Series(r.train.to_dict())
"""),
    md("""
More GPUs finish sooner, but a synchronous job stops whenever any of its GPUs fails, so its
interruptions grow with its size and its goodput falls. A sweep over GPU counts (layout pinned so
that each point is one evaluation):
"""),
    code("""
from plots import figures as plots

frame = plots.train_frame("llama3.1-8b", "dgx-h100", [64, 256, 1024, 4096, 16384],
                          global_batch_size=2048, seq_len=8192, train_tokens=1e12,
                          gpu_hour_price=2.0, tp=8, pp=1, cp=1, vp=1, zero_stage=1,
                          micro_batch_size=1, recompute="selective", sequence_parallel=True)
frame[["gpus", "step_time_s", "days", "gpu_hours", "energy_mwh", "cost",
       "expected_interruptions", "checkpoint_interval_s", "goodput"]]
"""),
    code("""
fig = plots.plot_goodput_vs_gpus(frame, title="Llama 3.1 8B, 1 T tokens on DGX H100")
fig
"""),
    code("""
plots.plot_cost_vs_days(frame)
"""),
]


# =============================================================================================
NOTEBOOKS["08_sweep"] = [
    md("""
# 8. A sweep: many scenarios, one search each

A sweep spec holds lists; a scenario is one element of their product, and each scenario runs the
full search. Here: two small models on two clusters at three GPU counts, and two HBM sizes of
the GPU (a hardware override), 24 scenarios, with the run figures for 20 B training tokens.
`workers=0` runs them in this process; leave it out for a Dask LocalCluster, or pass
`client="tcp://host:8786"` for a running cluster (`plan sweep SPEC.toml --out results.parquet`
on the command line; see `docs/sweep.md`).
"""),
    code(SETUP),
    code("""
from sweep import load_sweep_spec, sweep
from sweep.plots import mfu_heatmap, plot_cost_vs_days

spec = load_sweep_spec({
    "models": ["gpt3-125m", "gpt3-350m"],
    "clusters": ["dgx-h100", "dgx-a100-80g"],
    "gpus": [8, 16, 32],
    "global_batch": [64],
    "seq_len": [2048],
    "train_tokens": 20e9,
    "overrides": {"gpu.hbm_gib": [2, 80]},
})
table = sweep(spec, workers=0)
print(f"{spec.size} scenarios:", table["status"].value_counts().to_dict())
table[["model", "cluster", "gpus", "gpu.hbm_gib", "status", "dp", "tp", "pp", "zero_stage",
       "micro_batch_size", "step_time_s", "mfu", "train_days", "gpu_hours"]].head(8)
"""),
    md("""
A scenario where nothing fits is a row with the reason (here: 2 GiB of HBM), not an error:
"""),
    code("""
print(table.loc[table["status"] != "ok", "reason"].iloc[0])
"""),
    md("""
The best MFU per (cluster, GPU count), over the other parameters (here: the HBM size), one panel
per model; "-" where no scenario fits:
"""),
    code("""
mfu_heatmap(table)
"""),
    md("""
Cost (GPU-hours) against days to train, one point per scenario, and the Pareto front: the
scenarios no other one beats on both.
"""),
    code("""
plot_cost_vs_days(table)
"""),
]


# =============================================================================================
def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (without outputs)."""
    cells = []
    for kind, src in NOTEBOOKS[name]:
        cells.append(new_markdown_cell(src) if kind == "md" else new_code_cell(src))
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, timeout_s: int = 300) -> nbformat.NotebookNode:
    """Run every cell in a fresh python3 kernel (the interpreter running this script), in the
    notebooks folder; raises ``nbclient.exceptions.CellExecutionError`` on the first error."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(HERE)}})
    client.execute()
    return nb


#: The README's picture: (notebook, index of its code cell with the figure, file under docs/img).
README_IMAGE = ("03_pipeline", 2, "pipeline_schedules.png")


def save_readme_image(nb: nbformat.NotebookNode, index: int, name: str) -> Path:
    """Write the PNG output of the ``index``-th code cell of an executed notebook to docs/img."""
    import base64

    cell = [c for c in nb.cells if c.cell_type == "code"][index]
    png = next(o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {}))
    out = HERE.parent / "docs" / "img" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(png))
    return out


def main(argv: list[str]) -> None:
    run = "--no-exec" not in argv
    wanted = [a for a in argv if not a.startswith("--")]
    for name in NOTEBOOKS:
        if wanted and not any(w in name for w in wanted):
            continue
        nb = build(name)
        if run:
            execute(nb)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print("wrote", HERE / f"{name}.ipynb")
        if run and name == README_IMAGE[0]:
            print("wrote", save_readme_image(nb, README_IMAGE[1], README_IMAGE[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
