"""The six plans of issue #16 that every launch format is checked on (shared by the tests)."""

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
