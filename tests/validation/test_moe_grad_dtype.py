"""Gradient-reduction dtype of the MoE dev rows, read per source (validation.validate_moe)."""

import pandas as pd
import pytest

from perfmodel.memory.breakdown import optimizer_grad_copy_bytes, state_bytes_per_param
from validation import validate_moe as vm
from validation.validate import VALIDATION_DIR


@pytest.fixture(scope="module")
def df():
    return pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")


def _row(df, row_id):
    return df[df["row_id"] == row_id].iloc[0]


@pytest.mark.parametrize("row_id, fp32", [
    ("E0018", False),  # Megatron-Bridge 25.11 DeepSeek-V3: set_deepseek_v3_common_configs
    ("E0035", False),  # Megatron-Bridge GPT-OSS: set_gpt_oss_common_configs
    ("E0205", False),  # DGX Cloud Grok-1: optim.grad_sync_dtype: bf16
    ("E0256", False),  # NeMo 2.0 Llama-4 Scout fp8: set_precision_configs
    ("E0247", True),   # Megatron-LM MoE README Mixtral: --bf16 default fp32 main grads
    ("E0249", True),   # Megatron-LM DeepSeek-V3 GB200 study: no --grad-reduce-in-bf16
])
def test_row_grad_dtype_follows_its_recipe(df, row_id, fp32, monkeypatch):
    monkeypatch.setattr(vm, "RECIPE_GRAD_DTYPE", True)
    r = _row(df, row_id)
    assert vm.recipe_grad_reduce_in_fp32(r) is fp32
    case = vm.moe_case_from_row(r, df)
    assert case.training.grad_reduce_in_fp32 is fp32


def test_nemo2_bf16_keeps_fp32(df):
    r = _row(df, "E0256").copy()
    r["precision"] = "BF16"
    assert vm.recipe_grad_reduce_in_fp32(r) is True


def test_switch_off_reads_every_row_in_fp32(df, monkeypatch):
    monkeypatch.setattr(vm, "RECIPE_GRAD_DTYPE", False)  # the default (tuned check, docs/moe.md)
    assert vm.moe_case_from_row(_row(df, "E0018"), df).training.grad_reduce_in_fp32 is True


def test_bf16_grads_free_bytes_per_param():
    # bf16 training: fp32 main grads 4 B/param and no copy; bf16 grads 2 B + a 4 B fp32 copy of
    # the local shard's gradient at the optimizer step (distributed optimizer)
    assert state_bytes_per_param("bf16", fp32_main_grads=True)[1] == 4.0
    assert state_bytes_per_param("bf16", fp32_main_grads=False)[1] == 2.0
    assert optimizer_grad_copy_bytes("bf16", True) == 0.0
    assert optimizer_grad_copy_bytes("bf16", False) == 4.0
