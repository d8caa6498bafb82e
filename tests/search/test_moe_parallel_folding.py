"""Releases before MoE parallel folding (Megatron-Core 0.8 / 0.9: NeMo 24.07 / 24.09): the
presets state it with its source, it reaches the TrainingSpec, the search keeps ep | dp, the
launch config has no --expert-tensor-parallel-size, and the validation rows of those releases
use the layout (perfmodel.moe.expert_layout)."""

import numpy as np
import pandas as pd
import pytest

from emit.moe import megatron_bridge_moe_fields, megatron_moe_args
from perfmodel.core.errors import SpecError
from perfmodel.parallel.config import ParallelConfig
from perfmodel.spec.frameworks import apply_framework, load_framework
from perfmodel.spec.specs import TrainingSpec, load_cluster, load_model, load_training
from search.space import make_space

MIX = load_model("mixtral-8x7b")
TR = load_training(global_batch_size=256, seq_len=4096)
H100_64 = load_cluster("dgx-h100", gpus=64)


@pytest.mark.parametrize("name", ["nemo-24.07", "nemo-24.09"])
def test_pre_folding_presets_state_it_with_a_source(name):
    fw = load_framework(name)
    cap = fw.capabilities.moe_parallel_folding
    assert cap is not None and cap.value is False
    assert "tp-cp-ep-dp-pp" in cap.source and "0.10.0" in cap.source
    assert apply_framework(TR, fw).moe_parallel_folding is False


@pytest.mark.parametrize("name", ["bridge-25.09", "bridge-25.x", "bridge-26.02", "megatron-lm",
                                  "deepspeed", "torchtitan"])
def test_other_presets_keep_the_folded_layout(name):
    # DeepSpeed-MoE carves ep out of dp too, but without cp that is the folded layout with
    # etp = tp (perfmodel.moe.expert_layout)
    assert apply_framework(TR, load_framework(name)).moe_parallel_folding is True


def _valid(space) -> dict[str, np.ndarray]:
    parts: dict[str, list] = {}
    for flat in space.iter_chunks():
        a, v = space.decode_flat(flat)
        ok = v == 0
        for k in ("tp", "cp", "dp", "ep"):
            parts.setdefault(k, []).append(np.asarray(a[k])[ok])
    return {k: np.concatenate(v) for k, v in parts.items()}


def test_ep_divides_dp_before_folding():
    old = _valid(make_space(MIX, TR, H100_64, framework=load_framework("nemo-24.09"),
                            cp=[1, 2]))
    assert len(old["ep"]) and np.all(old["dp"] % old["ep"] == 0)
    new = _valid(make_space(MIX, TR, H100_64, framework=load_framework("bridge-25.x"),
                            cp=[1, 2]))
    assert np.any(new["dp"] % new["ep"] != 0)  # e.g. tp 4, cp 2, dp 2 with ep 8
    why = make_space(MIX, TR, H100_64, framework=load_framework("nemo-24.09"), tp=4, pp=2,
                     cp=2, ep=8, etp=4).explain_empty()
    assert ("nemo-24.09 (NeMo 24.09 (Megatron-Core 0.9)) cannot run ep 8 that does not divide "
            "dp 4") in why


def test_launch_config_has_no_etp_flag_before_folding():
    cfg = ParallelConfig(tp=2, pp=1, dp=4, ep=4, etp=2, sequence_parallel=True,
                         num_microbatches=8)
    pre = TrainingSpec(moe_parallel_folding=False)
    args = " ".join(megatron_moe_args(cfg, MIX, pre))
    assert "--expert-model-parallel-size 4" in args
    assert "--expert-tensor-parallel-size" not in args
    assert "--expert-tensor-parallel-size 2" in " ".join(megatron_moe_args(cfg, MIX,
                                                                         TrainingSpec()))
    assert "expert_tensor_parallel_size" not in megatron_bridge_moe_fields(cfg, MIX, pre)
    assert megatron_bridge_moe_fields(cfg, MIX, TrainingSpec())["expert_tensor_parallel_size"] == 2


def test_plan_records_the_layout_for_the_emitter():
    from emit.launch import training_from_setup
    from search.api import plan

    r = plan("mixtral-8x7b", "dgx-h100", gpus=64, global_batch_size=256, seq_len=4096,
             framework="nemo-24.09", top=1, tp=2, pp=1, cp=1, ep=8)
    assert r.setup["training_switches"]["moe_parallel_folding"] is False
    assert training_from_setup(r.setup).moe_parallel_folding is False


def test_validation_rows_of_those_releases_use_the_layout():
    from validation.validate import VALIDATION_DIR
    from validation.validate_moe import moe_case_from_row, release_moe_parallel_folding

    assert release_moe_parallel_folding("MCore v0.8") is False
    assert release_moe_parallel_folding("dgxc v24.11.1") is False  # taken as NeMo 24.09
    assert release_moe_parallel_folding("dgxc v25.02.01") is True  # NeMo 24.12 / MCore 0.10
    assert release_moe_parallel_folding("NeMo container 25.09") is True
    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv").set_index("row_id", drop=False)
    grok = moe_case_from_row(df.loc["E0205"])  # dgxc v24.11.1: t4 p8 cp2 ep8
    assert grok.training.moe_parallel_folding is False
    assert moe_case_from_row(df.loc["E0211"]).training.moe_parallel_folding is True
    assert moe_case_from_row(df.loc["E0247"]).training.moe_parallel_folding is False


def test_direct_training_spec_rejects_a_non_bool():
    with pytest.raises((SpecError, ValueError)):
        TrainingSpec(moe_parallel_folding="sometimes")
