"""The plans every launch format is checked on (shared by the tests): dense, uneven, MoE,
zero-bubble, context parallel, ZeRO-3, FP8 and MXFP8."""

from perfmodel.parallel.config import ParallelConfig, resolve_config
from perfmodel.spec.specs import load_model, load_training

#: name -> (model, cluster, gpus, training overrides, ParallelConfig fields)
PLANS = {
    # dense GPT, ZeRO-1 (distributed optimizer), interleaved pipeline, selective recompute, SP
    "gpt3-zero1-interleaved": ("gpt3-175b", "dgx-a100-80g", 1024,
                               {"global_batch_size": 1536, "seq_len": 2048, "precision": "bf16"},
                               {"dp": 16, "tp": 8, "pp": 8, "vp": 2, "schedule": "interleaved",
                                    "zero_stage": 1, "micro_batch_size": 1, "recompute": "selective",
                                    "sequence_parallel": True}),
    # dense Llama, ZeRO-3 (FSDP), full recompute, no model parallelism
    "llama-zero3": ("llama3.1-8b", "dgx-h100", 64,
                    {"global_batch_size": 256, "seq_len": 8192, "precision": "bf16"},
                    {"dp": 64, "zero_stage": 3, "micro_batch_size": 1, "recompute": "full"}),
    # ZeRO-3 with a pipeline: only torchtitan runs it
    "llama-zero3-pp": ("llama3.1-70b", "dgx-h100", 256,
                       {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"},
                       {"dp": 8, "tp": 8, "pp": 4, "zero_stage": 3, "micro_batch_size": 1,
                            "sequence_parallel": True, "recompute": "none"}),
    # uneven pipeline: 126 layers over 4 stages (31/32/32/31), and over 4x2 interleaved chunks
    "llama405b-uneven": ("llama3.1-405b", "dgx-h100", 512,
                         {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"},
                         {"dp": 16, "tp": 8, "pp": 4, "zero_stage": 1, "micro_batch_size": 1,
                              "sequence_parallel": True, "recompute": "full"}),
    "llama405b-uneven-interleaved": ("llama3.1-405b", "dgx-h100", 512,
                                     {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"},
                                     {"dp": 16, "tp": 8, "pp": 4, "vp": 2, "schedule": "interleaved",
                                          "zero_stage": 1, "micro_batch_size": 1,
                                          "sequence_parallel": True, "recompute": "selective"}),
    # 126 layers on pp 8 x vp 5 (40 chunks): only the balanced explicit layout fits (6 chunks of
    # 4 layers, 34 of 3; --pipeline-model-parallel-layout)
    "llama405b-balanced-interleaved": ("llama3.1-405b", "dgx-h100", 512,
                                       {"global_batch_size": 512, "seq_len": 8192,
                                        "precision": "bf16"},
                                       {"dp": 8, "tp": 8, "pp": 8, "vp": 5,
                                        "schedule": "interleaved", "zero_stage": 1,
                                        "micro_batch_size": 1, "sequence_parallel": True,
                                        "recompute": "selective"}),
    # context parallelism for a long sequence
    "llama-cp": ("llama3.1-8b", "dgx-h100", 64,
                 {"global_batch_size": 64, "seq_len": 32768, "precision": "bf16"},
                 {"dp": 8, "tp": 2, "cp": 4, "zero_stage": 1, "micro_batch_size": 1,
                      "sequence_parallel": True, "recompute": "selective"}),
    # context parallelism by all-to-all (Ulysses): cp 4 divides the 16 query and 4 K/V heads of
    # a tp-2 rank
    "llama-cp-a2a": ("llama3.1-8b", "dgx-h100", 64,
                     {"global_batch_size": 64, "seq_len": 32768, "precision": "bf16"},
                     {"dp": 8, "tp": 2, "cp": 4, "cp_comm": "a2a", "zero_stage": 1,
                      "micro_batch_size": 1, "sequence_parallel": True,
                      "recompute": "selective"}),
    # context parallelism by K/V all-gather (Transformer Engine's cp_comm_type "all_gather")
    "llama-cp-allgather": ("llama3.1-8b", "dgx-h100", 64,
                           {"global_batch_size": 64, "seq_len": 32768, "precision": "bf16"},
                           {"dp": 8, "tp": 2, "cp": 4, "cp_comm": "allgather", "zero_stage": 1,
                            "micro_batch_size": 1, "sequence_parallel": True,
                            "recompute": "selective"}),
    # hierarchical context parallelism: all-to-all over 4 (tp 2 x 4 = the 8-GPU node), the
    # ring over 2 nodes
    "llama-cp-hier": ("llama3.1-8b", "dgx-h100", 64,
                      {"global_batch_size": 64, "seq_len": 65536, "precision": "bf16"},
                      {"dp": 4, "tp": 2, "cp": 8, "cp_comm": "a2a+p2p", "cp_a2a": 4,
                       "zero_stage": 1, "micro_batch_size": 1, "sequence_parallel": True,
                       "recompute": "selective"}),
    # a layout of the DP searcher (search/dp.py): per-rank layer counts and block recompute
    "nemotron-dp-layout": ("nemotron4-340b", "dgx-h100", 128,
                           {"global_batch_size": 32, "seq_len": 4096, "precision": "bf16"},
                           {"dp": 2, "tp": 8, "pp": 8, "zero_stage": 1, "micro_batch_size": 1,
                                "sequence_parallel": True, "recompute": "none",
                                "stage_layers": (10, 11, 12, 12, 13, 13, 13, 12)}),
    # FP8 (delayed scaling) with TP + PP
    "llama-fp8": ("llama3.1-70b", "dgx-h100", 128,
                  {"global_batch_size": 512, "seq_len": 8192, "precision": "fp8"},
                  {"dp": 4, "tp": 4, "pp": 8, "zero_stage": 1, "micro_batch_size": 1,
                       "sequence_parallel": True, "recompute": "none"}),
    # the 405B search pick on 2,048 H100: interleaved 16 x 8 chunks with the embedding and the
    # loss counted as layers (0/1/1/.../1/0 layers a chunk)
    "llama405b-2048-emb-loss": ("llama3.1-405b", "dgx-h100", 2048,
                                {"global_batch_size": 2048, "seq_len": 8192, "precision": "bf16"},
                                {"dp": 8, "tp": 8, "pp": 16, "vp": 8, "cp": 2,
                                 "schedule": "interleaved", "zero_stage": 1,
                                 "micro_batch_size": 1, "sequence_parallel": True,
                                 "recompute": "none", "embedding_as_layer": True,
                                 "loss_as_layer": True}),
    # MoE with DeepSeek's first 3 dense layers, MLA, expert parallel 64, uneven pipeline
    "deepseek-v3-ep": ("deepseek-v3", "dgx-h100", 1024,
                       {"global_batch_size": 4096, "seq_len": 4096, "precision": "bf16"},
                       {"dp": 128, "tp": 1, "pp": 8, "ep": 64, "etp": 1, "zero_stage": 1,
                        "micro_batch_size": 1, "recompute": "full"}),
    # MoE under FSDP (ZeRO-3) with expert parallelism, no pipeline
    "mixtral-zero3-ep": ("mixtral-8x7b", "dgx-h100", 64,
                         {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16"},
                         {"dp": 64, "ep": 8, "etp": 1, "zero_stage": 3, "micro_batch_size": 1,
                          "recompute": "full"}),
    # zero-bubble (ZB-H1) pipeline with FSDP (ZeRO-2): torchtitan's zero-bubble schedule
    "llama-zb": ("llama3.1-70b", "dgx-h100", 256,
                 {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"},
                 {"dp": 8, "tp": 8, "pp": 4, "schedule": "zb", "zero_stage": 2,
                  "micro_batch_size": 1, "sequence_parallel": True, "recompute": "selective"}),
    # MXFP8 (Blackwell) with TP + PP and ZeRO-1, and with FSDP for torchtitan
    "llama-mxfp8": ("llama3.1-70b", "dgx-b200", 128,
                    {"global_batch_size": 512, "seq_len": 8192, "precision": "fp8",
                     "low_precision_recipe": "mxfp8"},
                    {"dp": 8, "tp": 4, "pp": 4, "zero_stage": 1, "micro_batch_size": 1,
                     "sequence_parallel": True, "recompute": "none"}),
    "llama-mxfp8-fsdp": ("llama3.1-8b", "dgx-b200", 64,
                         {"global_batch_size": 256, "seq_len": 8192, "precision": "fp8",
                          "low_precision_recipe": "mxfp8"},
                         {"dp": 32, "tp": 2, "zero_stage": 3, "micro_batch_size": 2,
                          "sequence_parallel": True, "recompute": "selective"}),
}


def load_plan(name):
    """(ParallelConfig resolved, ModelSpec, TrainingSpec) of a plan."""
    model_name, _, _, tr, cfg = PLANS[name]
    model = load_model(model_name)
    training = load_training(**tr)
    if model.num_layers % (cfg.get("pp", 1) * cfg.get("vp", 1)):  # uneven: resolve checks pp*vp
        c = ParallelConfig(**cfg, num_microbatches=tr["global_batch_size"]
                           // (cfg["dp"] * cfg["micro_batch_size"]))
    else:
        c = resolve_config(ParallelConfig(**cfg), model, training)
    return c, model, training
