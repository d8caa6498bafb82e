"""Framework presets (--framework): switches and what each stack can run."""

import numpy as np
import pytest

import search
from hardware_specs import list_presets
from perfmodel.core.errors import SpecError
from perfmodel.spec.frameworks import (
    apply_framework,
    framework_pins,
    load_framework,
    zero_pp_allowed,
)
from perfmodel.spec.specs import TrainingSpec


@pytest.mark.parametrize("name", list_presets("framework"))
def test_every_preset_loads(name):
    fw = load_framework(name)
    assert fw.name == name and fw.source


def test_megatron_2022_switches_are_the_2022_stack():
    t = apply_framework(TrainingSpec(), load_framework("megatron-2022"))
    assert not (t.overlap_grad_reduce or t.overlap_tp_comm or t.overlap_p2p_comm)
    assert not t.flash_attention


def test_deepspeed_refuses_zero2_3_with_pipelines():
    fw = load_framework("deepspeed")
    ok = zero_pp_allowed(fw, np.array([1, 2, 3, 3]), np.array([4, 4, 4, 1]),
                         np.ones(4, int), np.zeros(4, bool))
    assert ok.tolist() == [True, False, False, True]
    assert framework_pins(fw)["vp"] == [1]  # no interleaving in DeepSpeed's pipeline engine


def test_search_keeps_to_the_framework():
    r = search.plan("gpt3-13b", "dgx-a100-80g", gpus=64, framework="deepspeed", top=50)
    top = r.top
    assert ((top["pp"] == 1) | (top["zero_stage"] <= 1)).all()
    assert (top["cp"] == 1).all() and (~top["sequence_parallel"].astype(bool)).all()
    assert set(top["schedule"]) <= {"1f1b"}
    assert r.setup["framework"] == "deepspeed"


def test_pinned_value_the_framework_cannot_run_is_one_line():
    with pytest.raises(SpecError, match="framework megatron-2021 does not run zero_stage"):
        search.plan("gpt3-13b", "dgx-a100-80g", gpus=64, framework="megatron-2021", zero=1)
    with pytest.raises(SpecError, match="ZeRO stage <= 1 with pipeline"):
        search.plan("gpt3-13b", "dgx-a100-80g", gpus=64, framework="deepspeed", zero=3, pp=4)


def test_unknown_framework_suggests_names():
    with pytest.raises(SpecError, match="closest: megatron"):
        load_framework("megatrn")


def test_framework_can_pin_the_attention_kernel():
    # a recipe stack that turns cuDNN attention off (NVTE_FUSED_ATTN=0) sets flash-attn 2 on
    # the training; presets that say nothing leave the TrainingSpec's cuDNN
    from perfmodel.spec.frameworks import apply_framework
    from perfmodel.spec.specs import load_training

    fw = load_framework("nemo-24.09")
    assert fw.attention_backend is None
    t = load_training(global_batch_size=8, seq_len=4096)
    assert apply_framework(t, fw).attention_backend == "cudnn"
    fa2 = fw.model_copy(update={"attention_backend": "flash-attn-2"})
    assert apply_framework(t, fa2).attention_backend == "flash-attn-2"
