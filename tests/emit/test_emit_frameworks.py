"""Every emitted launch config, read back by the framework's own config code.

Needs the ``frameworks`` extra (``make frameworks``): DeepSpeed's ``DeepSpeedConfig``,
torchtitan's ``ConfigManager`` and ``ParallelDims``, Megatron-Core's ``TransformerConfig`` /
``DistributedDataParallelConfig`` / ``OptimizerConfig``, and Megatron-Bridge's source. Each plan
in :data:`emit_plans.PLANS` either parses with the planned degrees read back, or is refused with
a reason (and, through the search, an alternative that parses).

Megatron-Bridge cannot be imported on a CPU-only machine (``megatron.bridge`` imports
``transformer_engine.pytorch`` and, through Megatron-Core's Mamba layers, ``triton``): its YAML
is loaded with OmegaConf as Bridge loads it, the sections Bridge takes from Megatron-Core are
built with those real classes, and its own sections are checked against the dataclass fields
parsed (``ast``) from the installed Bridge source.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import json
import os
import socket
import warnings
from pathlib import Path

import pytest

from emit.launch import (
    _BRIDGE_PRECISION,
    CP_COMM_TYPE,
    FORMATS,
    emit,
    launch_settings,
    precision_recipe,
    refusals,
    stage_layers,
)
from tests.emit import megatron_lm_schema
from tests.emit.emit_plans import PLANS, load_plan

warnings.filterwarnings("ignore", message=".*Transformer Engine.*")


# ------------------------------------------------------------------------------------------
# framework readers: each returns the degrees the framework read
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deepspeed_config():
    pytest.importorskip("deepspeed")
    import deepspeed
    import deepspeed.comm as dscomm
    import torch.distributed as tdist
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.config import DeepSpeedConfig

    # one-process gloo group on the loopback, so DeepSpeedConfig asks the mpu for the
    # data-parallel size; DeepSpeed's CPU shared-memory all-reduce kernel (a JIT C++ build)
    # is not needed to read a config
    if not tdist.is_initialized():
        _gloo_world()
    shm = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if shm is not None:
        deepspeed.ops.__compatible_ops__[shm.NAME] = False
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False,
                            dist_init_required=False)

    class MPU:  # the Megatron-style mpu interface DeepSpeedConfig reads
        def __init__(self, dp):
            self.dp = dp

        def get_data_parallel_world_size(self):
            return self.dp

    def read(text, dp):
        cfg = DeepSpeedConfig(json.loads(text), mpu=MPU(dp))
        return {"dp": cfg.world_size, "zero": cfg.zero_optimization_stage,
                "mbs": cfg.train_micro_batch_size_per_gpu,
                "accum": cfg.gradient_accumulation_steps, "batch": cfg.train_batch_size,
                "tp": max(cfg.tensor_parallel_config.autotp_size, 1),
                "pp": cfg.pipeline["stages"] if "pipeline" in json.loads(text) else 1,
                "bf16": cfg.bfloat16_config.enabled, "fp16": cfg.float16_config.enabled}

    return read


@contextlib.contextmanager
def _fake_world(rank, world_size):
    """A ``fake`` default process group of ``world_size`` ranks (torch's FakeStore: no
    communication) in place of the one-process gloo group the DeepSpeed reader set up, which
    is put back afterwards."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    had = tdist.is_initialized()
    if had:
        tdist.destroy_process_group()
    tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        tdist.destroy_process_group()
        if had:
            _gloo_world()


def _gloo_world():
    """A one-process gloo group on the loopback."""
    import torch.distributed as tdist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    tdist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")


def _torchtitan_stages(jc, gpus, n_layers):
    """torchtitan's pipeline split of the job config, as ``pipeline_llm`` runs it: a small
    llama3 (the debug model with the planned layer count) on the meta device, split by
    ``pipeline_module_split`` with the configured schedule on the first and the last pipeline
    rank of a fake process group, and the schedule built by ``build_pipeline_schedule``.
    Returns {pp rank: (schedule class name, micro-batches, [(stage index, decoder layers)])}."""
    import torch
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        build_pipeline_schedule,
        pipeline_module_split,
    )
    from torchtitan.models.llama3 import Transformer, llama3_args

    p = jc.parallelism
    args = dataclasses.replace(llama3_args["debugmodel"], n_layers=n_layers)
    with torch.device("meta"):
        model = Transformer(args)
    out = {}
    for pp_rank in sorted({0, p.pipeline_parallel_degree - 1}):
        with _fake_world(pp_rank * (gpus // p.pipeline_parallel_degree), gpus):
            dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree,
                                dp_shard=p.data_parallel_shard_degree,
                                cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                                pp=p.pipeline_parallel_degree, ep=1, etp=1, world_size=gpus)
            mesh = dims.get_mesh("pp")
            assert mesh.get_local_rank() == pp_rank
            stages, parts = pipeline_module_split(
                model, mesh, p.pipeline_parallel_schedule, torch.device("meta"),
                p.module_fqns_per_model_part)
            sched = build_pipeline_schedule(jc, stages, lambda out, target: out.sum())
            out[pp_rank] = (type(sched).__name__, sched._n_microbatches,
                            [(st.stage_index, len(m.layers)) for st, m in zip(stages, parts,
                                                                            strict=True)])
    return out


@pytest.fixture(scope="module")
def torchtitan_config(tmp_path_factory):
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims

    d = tmp_path_factory.mktemp("tt")

    def read(text, gpus):
        f = d / "job.toml"
        f.write_text(text)
        jc = ConfigManager().parse_args(["--job.config_file", str(f)])
        p = jc.parallelism
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree,
                            dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
                            tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                            ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                            world_size=gpus)  # raises unless the degrees fill it
        got = {"jc": jc, "dp": dims.dp_replicate * dims.dp_shard, "tp": dims.tp,
               "pp": dims.pp, "cp": dims.cp, "ep": dims.ep,
               "chunks": p.module_fqns_per_model_part}
        if dims.pp > 1:
            n_layers = sum(x.startswith("layers.") for part in p.module_fqns_per_model_part
                           for x in part)
            got["stages"] = _torchtitan_stages(jc, gpus, n_layers)
        return got

    return read


def _bridge_root() -> Path:
    spec = importlib.util.find_spec("megatron.bridge")
    if spec is None:
        pytest.skip("megatron-bridge is not installed (make frameworks)")
    return Path(next(iter(spec.submodule_search_locations)))


def _class_fields(path: Path, cls: str) -> set[str]:
    """Annotated fields of dataclass ``cls`` in ``path`` (and of its bases in the same file)."""
    tree = ast.parse(path.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out: set[str] = set()
    todo = [cls]
    while todo:
        c = classes[todo.pop()]
        out |= {s.target.id for s in c.body if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)}
        todo += [b.id for b in c.bases if isinstance(b, ast.Name) and b.id in classes]
    return out


@pytest.fixture(scope="module")
def bridge_config():
    pytest.importorskip("megatron.core")
    omegaconf = pytest.importorskip("omegaconf")
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    root = _bridge_root()
    cfg_py = root / "training" / "config.py"
    tc_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    schema = {
        "model": tc_fields | _class_fields(root / "models" / "gpt_provider.py",
                                           "GPTModelProvider"),
        "train": _class_fields(cfg_py, "TrainingConfig"),
        "dist": _class_fields(cfg_py, "DistributedInitConfig"),
        "checkpoint": _class_fields(cfg_py, "CheckpointConfig"),
        "dataset": {f.name for f in dataclasses.fields(GPTDatasetConfig)}
        | _class_fields(cfg_py, "GPTDatasetConfig") | _class_fields(cfg_py, "DataloaderConfig"),
        "comm_overlap": _class_fields(root / "training" / "comm_overlap.py",
                                      "CommOverlapConfig"),
    }
    mp_tree = ast.parse((root / "training" / "mixed_precision.py").read_text())
    recipes = {n.name for n in mp_tree.body if isinstance(n, ast.FunctionDef)
               and any(getattr(d, "id", None) == "register" for d in n.decorator_list)}
    assert "bf16_mixed" in recipes and "bf16_with_fp8_current_scaling_mixed" in recipes

    def read(text, gpus):
        import torch
        from megatron.core.transformer.enums import AttnBackend

        doc = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.create(text))
        for sec, keys in schema.items():
            unknown = set(doc.get(sec) or {}) - keys
            assert not unknown, f"{sec}: not fields of Megatron-Bridge's config: {unknown}"
        mp = doc.get("mixed_precision")
        assert mp is None or mp in recipes, f"mixed_precision {mp!r} is not a Bridge recipe"
        model = {k: v for k, v in doc["model"].items() if k in tc_fields}
        if model.get("attention_backend"):
            model["attention_backend"] = AttnBackend[model["attention_backend"]]
        dtype = torch.float32 if mp is None else torch.float16 if "fp16" in mp else torch.bfloat16
        model.update(params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
                     fp16=dtype == torch.float16)
        if mp and "fp8" in mp:
            model["fp8"] = "hybrid"
        tc = TransformerConfig(**model)  # Megatron-Core's own checks
        DistributedDataParallelConfig(**doc["ddp"])
        OptimizerConfig(**doc["optimizer"])
        assert doc["ddp"]["use_distributed_optimizer"] == doc["optimizer"][
            "use_distributed_optimizer"]
        mp_size = (tc.tensor_model_parallel_size * tc.pipeline_model_parallel_size
                   * tc.context_parallel_size)
        assert gpus % mp_size == 0
        dp = gpus // mp_size
        assert doc["train"]["global_batch_size"] % (doc["train"]["micro_batch_size"] * dp) == 0
        vp = tc.virtual_pipeline_model_parallel_size
        if tc.pipeline_model_parallel_layout is not None:
            vp = tc.pipeline_model_parallel_layout.virtual_pipeline_model_parallel_size
        return {"tp": tc.tensor_model_parallel_size, "pp": tc.pipeline_model_parallel_size,
                "cp": tc.context_parallel_size, "vp": vp or 1, "dp": dp, "tc": tc,
                "doc": doc}

    return read


@pytest.fixture(scope="module")
def megatron_config(tmp_path_factory):
    pytest.importorskip("megatron.core")
    d = tmp_path_factory.mktemp("megatron")
    for name in ("0", "1", ","):  # files a bare glob pattern like [0,1] would match
        (d / name).write_text("")

    def read(text, gpus):
        args = megatron_lm_schema.parse(text, d)
        tc, ddp, dp = megatron_lm_schema.core_configs(args, gpus)
        vp = tc.virtual_pipeline_model_parallel_size
        if tc.pipeline_model_parallel_layout is not None:
            vp = tc.pipeline_model_parallel_layout.virtual_pipeline_model_parallel_size
        return {"tp": tc.tensor_model_parallel_size, "pp": tc.pipeline_model_parallel_size,
                "cp": tc.context_parallel_size, "vp": vp or 1, "dp": dp, "tc": tc,
                "ddp": ddp, "args": args}

    return read


# ------------------------------------------------------------------------------------------
# the matrix: 7 plans x 4 formats
# ------------------------------------------------------------------------------------------
def _check(fmt, text, c, model, training, gpus, readers):
    """Read the file back with the framework's own code and compare each planned choice:
    degrees (dp, tp, pp, vp, cp, ep), micro-batch, micro-batches per step and global batch,
    schedule, recompute and precision."""
    got = readers[fmt](text, gpus) if fmt != "deepspeed" else readers[fmt](text, c.dp)
    assert got["dp"] == c.dp and got["tp"] == c.tp and got["pp"] == c.pp
    plan = {"chunks": stage_layers(c, model), "recipe": precision_recipe(training),
            "n_micro": training.global_batch_size // (c.dp * c.micro_batch_size)}
    {"megatron": _check_megatron, "bridge": _check_bridge, "torchtitan": _check_torchtitan,
     "deepspeed": _check_deepspeed}[fmt](got, c, model, training, plan)


def _check_megatron_core(tc, got, c, model, training, plan):
    """Megatron-Core's TransformerConfig (Megatron-LM and Bridge alike)."""
    chunks = plan["chunks"]
    assert got["cp"] == c.cp and got["vp"] == c.vp
    if c.cp > 1:  # Megatron-Core's cp_comm_type (None: Transformer Engine's p2p ring), the
        # string Transformer Engine's attn_forward_func_with_cp accepts
        assert (tc.cp_comm_type or "p2p") == CP_COMM_TYPE[c.cp_comm]
        assert tc.cp_comm_type in (None, "p2p", "all_gather", "a2a", "a2a+p2p")
        sizes = tc.hierarchical_context_parallel_sizes
        if c.cp_comm == "a2a+p2p":  # the a2a (inner) group first, the ring second
            assert list(sizes) == [c.cp_a2a, c.cp // c.cp_a2a]
        else:
            assert sizes is None
    assert tc.expert_model_parallel_size == (c.ep if model.is_moe else 1)
    if model.is_moe:
        assert tc.num_moe_experts == model.num_experts
        assert tc.expert_tensor_parallel_size == c.expert_tp
        assert tc.moe_router_topk == model.moe_top_k
    # Megatron runs interleaved 1F1B when vp > 1, else 1F1B: the plan's schedule
    assert {"interleaved": True, "1f1b": False}[c.schedule if c.pp > 1 else "1f1b"] == (
        got["vp"] > 1)
    assert tc.sequence_parallel == c.sequence_parallel
    assert tc.num_layers == model.num_layers and tc.num_query_groups == model.kv_heads
    assert tc.recompute_granularity == (None if c.recompute == "none" else c.recompute)
    lay = getattr(tc, "pipeline_model_parallel_layout", None)
    if lay is not None:  # an explicit layout: Megatron-Core's own parse
        from megatron.core.transformer.enums import LayerType

        lay.validate_layer_layout(model.num_layers, 0)
        built = [lay.layout[i % c.pp][i // c.pp].count(LayerType.decoder)
                 for i in range(c.pp * c.vp)]
        assert built == chunks
    elif len(set(chunks)) > 1 and not (c.embedding_as_layer or c.loss_as_layer):
        if c.vp == 1:
            assert tc.num_layers_in_first_pipeline_stage == chunks[0]
            assert tc.num_layers_in_last_pipeline_stage == chunks[-1]
    else:
        assert tc.account_for_embedding_in_pipeline_split == c.embedding_as_layer
        assert tc.account_for_loss_in_pipeline_split == c.loss_as_layer
    recipe = plan["recipe"]
    assert tc.bf16 == (recipe not in ("fp16", "fp32")) and tc.fp16 == (recipe == "fp16")
    fp8 = {"fp8-delayed": "delayed", "fp8-cs": "tensorwise", "fp8-block": "blockwise",
           "mxfp8": "mxfp8"}.get(recipe)
    assert (tc.fp8 is not None) == (fp8 is not None)
    return fp8


def _check_megatron(got, c, model, training, plan):
    fp8 = _check_megatron_core(got["tc"], got, c, model, training, plan)
    a = got["args"]
    if fp8:  # --fp8-recipe (Bridge's recipe is its mixed_precision name)
        assert a.fp8_recipe == fp8
    assert a.micro_batch_size == c.micro_batch_size
    assert a.global_batch_size == training.global_batch_size
    assert a.global_batch_size // (a.micro_batch_size * got["dp"]) == plan["n_micro"]
    assert a.use_distributed_optimizer == (c.zero_stage == 1)
    assert a.use_megatron_fsdp == (c.zero_stage >= 2)
    if model.position_embedding == "rope":
        assert a.rotary_base == int(model.rope_base)
    assert a.untie_embeddings_and_output_weights == (not model.tied_embeddings)
    if model.is_moe:  # Megatron-LM's moe_freq_type, as Megatron-Core expands an int
        d, k = model.moe_dense_layers, model.moe_layer_freq
        want = [0] * d + [1 if (i + 1) % k == 0 else 0 for i in range(model.num_layers - d)]
        freq = a.moe_layer_freq
        if isinstance(freq, int):
            freq = [1 if i % freq == 0 else 0 for i in range(model.num_layers)]
        assert freq == want


def _check_bridge(got, c, model, training, plan):
    _check_megatron_core(got["tc"], got, c, model, training, plan)
    doc = got["doc"]
    assert doc["train"]["micro_batch_size"] == c.micro_batch_size
    assert doc["train"]["global_batch_size"] == training.global_batch_size
    assert doc["model"]["share_embeddings_and_output_weights"] == model.tied_embeddings
    assert doc["optimizer"]["use_distributed_optimizer"] == (c.zero_stage == 1)
    assert doc.get("dist", {}).get("use_megatron_fsdp", False) == (c.zero_stage >= 2)
    assert doc["mixed_precision"] == _BRIDGE_PRECISION.get(plan["recipe"])


def _check_torchtitan(got, c, model, training, plan):
    jc, chunks = got["jc"], plan["chunks"]
    p = jc.parallelism
    assert got["cp"] == c.cp and got["ep"] == (c.ep if model.is_moe else 1)
    assert jc.training.local_batch_size * c.dp == training.global_batch_size
    assert jc.training.global_batch_size == training.global_batch_size
    assert p.pipeline_parallel_microbatch_size == c.micro_batch_size
    assert jc.activation_checkpoint.mode == c.recompute
    assert {0: "default", 2: "never", 3: "always"}[c.zero_stage] == p.fsdp_reshard_after_forward
    if c.pp > 1:  # the planned split, not torchtitan's default one
        layers = [sum(x.startswith("layers.") for x in part) for part in got["chunks"]]
        assert layers == chunks
        # built as torchtitan builds it: the chunks of each pipeline rank, the schedule
        cls = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
               "interleaved": "ScheduleInterleaved1F1B",
               "zb": "ScheduleInterleavedZeroBubble"}[c.schedule]
        for rank, (name, n_micro, built) in got["stages"].items():
            assert name == cls and n_micro == plan["n_micro"]
            assert built == [(rank + k * c.pp, chunks[rank + k * c.pp]) for k in range(c.vp)]
    recipe = plan["recipe"]
    assert jc.training.mixed_precision_param == ("float32" if recipe == "fp32" else "bfloat16")
    conv = {"fp8-cs": ["quantize.linear.float8"], "mxfp8": ["quantize.linear.mx"]}
    assert list(jc.model.converters) == conv.get(recipe, [])
    if recipe == "fp8-cs":
        assert jc.quantize.linear.float8.recipe_name == "tensorwise"


def _check_deepspeed(got, c, model, training, plan):
    assert got["zero"] == c.zero_stage and got["mbs"] == c.micro_batch_size
    assert got["batch"] == training.global_batch_size
    assert got["accum"] == plan["n_micro"]
    assert got["bf16"] == (plan["recipe"] == "bf16") and got["fp16"] == (plan["recipe"] == "fp16")


@pytest.fixture(scope="module")
def readers(megatron_config, bridge_config, torchtitan_config, deepspeed_config):
    return {"megatron": megatron_config, "bridge": bridge_config,
            "torchtitan": torchtitan_config, "deepspeed": deepspeed_config}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("plan", list(PLANS))
def test_plan_parses_or_is_refused(plan, fmt, readers):
    c, model, training = load_plan(plan)
    gpus = PLANS[plan][2]
    why = refusals(fmt, c, model, training)
    if why:
        assert all(len(w.splitlines()) == 1 and w for w in why)
        return
    _check(fmt, emit(fmt, c, model, training), c, model, training, gpus, readers)


def test_expected_refusals():
    """The cases: DeepSpeed ZeRO-3 + pipeline, torchtitan ZeRO-1, schedules."""
    def why(plan, fmt):
        c, m, t = load_plan(plan)
        return " ".join(refusals(fmt, c, m, t))

    assert "ZeRO-3 with pipeline" in why("llama-zero3-pp", "deepspeed")
    assert "ZeRO-3 with pipeline" in why("llama-zero3-pp", "megatron")
    assert why("llama-zero3-pp", "torchtitan") == ""
    assert "no ZeRO-1" in why("gpt3-zero1-interleaved", "torchtitan")
    assert "interleaved" in why("gpt3-zero1-interleaved", "deepspeed")
    assert "context parallel" in why("llama-cp", "deepspeed")
    assert "Ulysses" in why("llama-cp-a2a", "deepspeed")
    assert "cp_comm 'a2a'" in why("llama-cp-a2a", "torchtitan")
    for plan, comm in (("llama-cp-allgather", "allgather"), ("llama-cp-hier", "a2a+p2p")):
        assert f"cp_comm '{comm}'" in why(plan, "torchtitan")
        assert f"no {comm} context parallelism" in why(plan, "deepspeed")
        assert why(plan, "megatron") == "" and why(plan, "bridge") == ""
    assert "fp8-delayed" in why("llama-fp8", "deepspeed")
    assert why("llama-fp8", "megatron") == "" and why("llama-fp8", "bridge") == ""
    assert why("llama405b-uneven", "megatron") == ""


@pytest.mark.slow
def test_refused_formats_get_an_alternative_that_parses(readers):
    """Each refusal offers the best configuration of a search restricted to that framework;
    that configuration's settings parse too."""
    from search import plan as search_plan

    seen = 0
    for name in ("llama-zero3-pp", "llama-cp", "llama-fp8"):
        c, model, training = load_plan(name)
        model_name, cluster, gpus, tr, _ = PLANS[name]

        def replan(framework, precision, model_name=model_name, cluster=cluster, gpus=gpus,
                   tr=tr):
            return search_plan(model_name, cluster, gpus=gpus, top=1, framework=framework,
                               **{**tr, "precision": precision})

        for fmt, L in launch_settings(c, model, training, replan=replan).items():
            if L.text is not None:
                continue
            alt = L.alternative
            assert alt and alt.get("text"), (name, fmt, L.refused, alt)
            ac = load_plan_config(alt["config"])
            recipe = alt["precision"]  # a recipe name: the precision and its recipe
            base = "fp8" if recipe.startswith("fp8") or recipe == "mxfp8" else recipe
            alt_training = training.model_copy(update={
                "precision": base, "low_precision_recipe": recipe if recipe != base else None})
            _check(fmt, alt["text"], ac, model, alt_training, gpus, readers)
            assert "nearest that" in L.message()
            seen += 1
    assert seen >= 5


def load_plan_config(cfg):
    from perfmodel.parallel.config import ParallelConfig

    return ParallelConfig(**cfg)


def test_torchtitan_flavor_is_the_model(torchtitan_config):
    """The llama3 flavors named for our presets have the presets' architecture."""
    from torchtitan.models.llama3 import llama3_args

    from emit.launch import _TORCHTITAN_FLAVOR
    from perfmodel.spec.specs import load_model

    for preset, (_, flavor) in _TORCHTITAN_FLAVOR.items():
        m, a = load_model(preset), llama3_args[flavor]
        assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.vocab_size, a.rope_theta) == (
            m.hidden_size, m.num_layers, m.num_attention_heads, m.kv_heads, m.vocab_size,
            m.rope_base), preset


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_emit_output_is_a_file_the_framework_reads(fmt, readers):
    """`plan --emit X > file`: stdout alone is read by the framework, with the planned degrees."""
    from typer.testing import CliRunner

    from cli.main import app
    from tests.cli.test_cli_emit_validate import ALL_RUN

    r = CliRunner().invoke(app, [*ALL_RUN, "--emit", fmt])
    assert r.exit_code == 0, r.output
    got = readers[fmt](r.stdout, 16) if fmt != "deepspeed" else readers[fmt](r.stdout, 8)
    assert (got["dp"], got["tp"], got["pp"]) == (8, 1, 2)


#: Searches with no --framework: a dense model, and an MoE one with DeepSeek's dense layers
_SEARCHES = {
    "dense": ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "64",
              "--global-batch", "256", "--seq-len", "8192"],
    "moe": ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024",
            "--global-batch", "4096", "--seq-len", "4096"],
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("search", ["dense", pytest.param("moe", marks=pytest.mark.slow)])
def test_cli_emit_without_framework_plans_for_the_format(search, fmt, readers):
    """`plan --emit X` alone plans for X's newest preset, says so first, exits 0, and prints
    a file X's own code reads with the degrees of the plan it reports."""
    from typer.testing import CliRunner

    from cli.main import app
    from emit.launch import FORMAT_FRAMEWORK

    args = _SEARCHES[search]
    r = CliRunner().invoke(app, [*args, "--emit", fmt])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[0].startswith(f"framework {FORMAT_FRAMEWORK[fmt]}: ")
    doc = json.loads(CliRunner().invoke(app, [*args, "--emit", fmt, "--json"]).stdout)
    c = doc["best"]["config"]
    gpus = int(args[args.index("--gpus") + 1])
    got = readers[fmt](r.stdout, gpus) if fmt != "deepspeed" else readers[fmt](r.stdout, c["dp"])
    assert (got["dp"], got["tp"], got["pp"]) == (c["dp"], c["tp"], c["pp"])


def test_torchtitan_refuses_micro_batches_its_rounds_cannot_split(torchtitan_config):
    """m = 16 micro-batches on pp = 3: torch's round-based schedules raise; the emitter
    refuses first, and what it writes (m = 15) builds."""
    from perfmodel.parallel.config import ParallelConfig
    from perfmodel.spec.specs import load_model, load_training

    model = load_model("llama3.1-8b")
    c = ParallelConfig(dp=2, tp=1, pp=3, zero_stage=2, micro_batch_size=1, schedule="zb",
                       recompute="none", stage_layers=(11, 11, 10))
    bad = load_training(global_batch_size=32, seq_len=4096)
    assert "rounds" in " ".join(refusals("torchtitan", c, model, bad))
    good = load_training(global_batch_size=30, seq_len=4096)
    got = torchtitan_config(emit("torchtitan", c, model, good), c.gpus)
    assert all(name == "ScheduleInterleavedZeroBubble" and n == 15
               for name, n, _ in got["stages"].values())


def _plan_settings(name):
    """The command-line settings of a plan of :data:`emit_plans.PLANS` (nothing pinned)."""
    model, cluster, gpus, tr, _ = PLANS[name]
    precision = tr.get("low_precision_recipe") or tr["precision"]
    return ["--model", model, "--cluster", cluster, "--gpus", str(gpus), "--global-batch",
            str(tr["global_batch_size"]), "--seq-len", str(tr["seq_len"]),
            "--precision", precision]


def _format_runs_precision(fmt, precision):
    """Whether the newest preset of ``fmt`` switches on ``precision`` (a format that cannot
    run the setting is not asked for it: its search refuses the precision itself)."""
    from emit.launch import FORMAT_FRAMEWORK
    from perfmodel.spec.frameworks import load_framework
    from perfmodel.spec.specs import load_training

    recipe = precision_recipe(load_training(precision=precision))
    return recipe in load_framework(FORMAT_FRAMEWORK[fmt]).precisions


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(PLANS))
def test_emit_without_framework_on_every_plan_setting(name, fmt, readers):
    """`plan <the plan's model, GPUs, batch, sequence, precision> --emit X`, no --framework:
    X's preset searches only what X runs, so it exits 0, and the file passes X's own checks
    with the degrees, micro-batches, schedule, recompute and precision of the plan it reports."""
    from typer.testing import CliRunner

    from cli.main import app
    from perfmodel.spec.specs import load_model, load_training

    args = _plan_settings(name)
    if not _format_runs_precision(fmt, args[-1]):
        pytest.skip(f"{fmt}'s preset does not run precision {args[-1]}")
    r = CliRunner().invoke(app, [*args, "--emit", fmt])
    assert r.exit_code == 0, r.output
    doc = json.loads(CliRunner().invoke(app, [*args, "--emit", fmt, "--json"]).stdout)
    c = load_plan_config(doc["best"]["config"])
    tr = PLANS[name][3]
    training = load_training(global_batch_size=tr["global_batch_size"], seq_len=tr["seq_len"],
                             precision=doc["setup"]["precision"])
    assert r.stdout.strip() == doc["launch"][fmt]["text"].strip()
    _check(fmt, r.stdout, c, load_model(PLANS[name][0]), training, PLANS[name][2], readers)
