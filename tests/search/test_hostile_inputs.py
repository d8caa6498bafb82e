"""Hostile input to every loader ends in a result or one SpecError line, within a size bound:
arbitrary bytes and arbitrary JSON / TOML values (hypothesis), and the specific cases that
raised other exceptions, hung or were accepted."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware_specs import calibration_dir
from perfmodel.core.files import MAX_SPEC_BYTES, parse_json, parse_toml, read_text_bounded
from perfmodel.hardware.calibration import load_calibration
from perfmodel.spec.specs import (
    ClusterSpec,
    GPUSpec,
    ModelSpec,
    SpecError,
    build_spec,
    load_cluster,
    load_gpu,
    load_model,
    load_training,
    model_from_hf_config,
)
from realtime.placement import load_realtime
from search import api
from search import space as space_module
from search.space import check_search_size, make_space
from validation import calibrate, validate

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
    max_leaves=20,
)
HF_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
           "intermediate_size", "vocab_size", "hidden_act", "rope_theta", "layer_types",
           "sliding_window", "num_local_experts", "num_experts_per_tok", "kv_lora_rank",
           "qk_nope_head_dim", "v_head_dim", "text_config", "n_layer", "n_embd", "n_head",
           "hybrid_override_pattern", "model_type", "tie_word_embeddings", "moe_layer_freq")
VALID_HF = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 1000}
LOADERS = (load_model, load_cluster, load_gpu, load_training, load_realtime)


def _result_or_spec_error(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except SpecError as e:
        assert "\n" not in str(e), str(e)
        return None


# --------------------------------------------------------------------------------------------
# property tests
# --------------------------------------------------------------------------------------------
@SETTINGS
@given(data=st.binary(max_size=2048), suffix=st.sampled_from([".toml", ".json"]))
def test_arbitrary_bytes_to_every_spec_loader(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"spec{suffix}"
        p.write_bytes(data)
        for loader in LOADERS:
            _result_or_spec_error(loader, p)


@SETTINGS
@given(value=json_values, suffix=st.sampled_from([".toml", ".json"]))
def test_arbitrary_json_values_to_every_spec_loader(value, suffix):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"spec{suffix}"
        if suffix == ".json":
            p.write_text(json.dumps(value))
        else:
            doc = value if isinstance(value, dict) else {"value": value}
            p.write_text("\n".join(f"{json.dumps(str(k))} = {json.dumps(v)}"
                                   for k, v in doc.items()
                                   if not (isinstance(v, float) and not np.isfinite(v))))
        for loader in LOADERS:
            _result_or_spec_error(loader, p)


@SETTINGS
@given(extra=st.fixed_dictionaries({}, optional={k: json_values for k in HF_KEYS}),
       base=st.booleans())
def test_arbitrary_hf_config_values(extra, base):
    _result_or_spec_error(model_from_hf_config, {**(VALID_HF if base else {}), **extra})


@SETTINGS
@given(value=json_values)
def test_arbitrary_training_dict(value):
    doc = value if isinstance(value, dict) else {"global_batch_size": value}
    _result_or_spec_error(load_training, doc)


@pytest.fixture(scope="module")
def cal_copy(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal") / "h200"
    shutil.copytree(calibration_dir("h200"), d)
    return d


@SETTINGS
@given(data=st.binary(max_size=1024),
       name=st.sampled_from(["gemm.csv", "attention.csv", "memops.csv", "env.json"]))
def test_arbitrary_bytes_in_a_calibration_folder(cal_copy, data, name):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "h200"
        shutil.copytree(cal_copy, folder)
        (folder / name).write_bytes(data)
        _result_or_spec_error(load_calibration, folder, "h200-sxm-141gb")


@SETTINGS
@given(data=st.binary(max_size=1024) | st.text(max_size=600).map(str.encode))
def test_arbitrary_bytes_as_a_runs_table(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "runs.csv"
        p.write_bytes(data)
        if _result_or_spec_error(calibrate.read_runs, p) is not None:
            df = calibrate.read_runs(p)
            calibrate.runs_to_cases(df)
        _result_or_spec_error(validate.read_runs, p)


# --------------------------------------------------------------------------------------------
# the specific cases
# --------------------------------------------------------------------------------------------
def _one_line(fn, *args, match: str | None = None, **kw) -> str:
    with pytest.raises(SpecError, match=match) as err:
        fn(*args, **kw)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("text,parse", [("[" * 5000 + "]" * 5000, parse_json),
                                        ("a = " + "[" * 5000 + "]" * 5000, parse_toml)])
def test_deep_nesting_is_one_line(text, parse):
    _one_line(parse, text, "f", match="nested too deeply|not valid")


@pytest.mark.parametrize("loader", LOADERS)
def test_deeply_nested_file_for_every_loader(tmp_path, loader):
    (tmp_path / "a.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "a.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000)
    _one_line(loader, tmp_path / "a.json")
    _one_line(loader, tmp_path / "a.toml")


@pytest.mark.parametrize("dev", ["/dev/zero", "/dev/urandom"])
def test_endless_device_as_a_spec_is_refused_after_a_bounded_read(dev):
    if not Path(dev).exists():
        pytest.skip(f"no {dev}")
    _one_line(read_text_bounded, dev, "TOML", match=f"larger than {MAX_SPEC_BYTES / 2**20:g} MiB")
    _one_line(load_model, dev)


@pytest.mark.parametrize("data", [[1, 2], 42, "x", None])
def test_cluster_json_that_is_not_an_object(tmp_path, data):
    (tmp_path / "c.json").write_text(json.dumps(data))
    _one_line(load_cluster, tmp_path / "c.json", match="expected a JSON object")


@pytest.mark.parametrize("patch", [{"hidden_act": ["silu"]}, {"rope_theta": "1e4"},
                                   {"rope_theta": None}, {"layer_types": 3},
                                   {"vocab_size": 1}])
def test_hf_config_bad_values_are_one_line(patch):
    _one_line(model_from_hf_config, {**VALID_HF, **patch})


def test_hf_config_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    _one_line(load_model, tmp_path / "config.json", match="JSON object")


def test_absurd_specs_are_refused():
    m = load_model("gpt3-125m").model_dump()
    _one_line(model_from_hf_config, {**VALID_HF, "vocab_size": 1})
    c = load_cluster("dgx-h100").model_dump()
    c["tiers"][0]["domain_size"] = 3
    _one_line(build_spec, ClusterSpec, c, "c", match="domain_size")
    g = load_gpu("h100-sxm5-80gb").model_dump()
    g["sustained_gemm_fraction"] = 5.0
    _one_line(build_spec, GPUSpec, g, "g", match="sustained_gemm_fraction")
    m["num_layers"] = 10**9
    _one_line(build_spec, ModelSpec, m, "m", match="num_layers")


def test_training_global_batch_beyond_int64_is_one_line(tmp_path):
    (tmp_path / "t.toml").write_text(f"global_batch_size = {10**30}\n")
    _one_line(load_training, tmp_path / "t.toml", match="global_batch_size")


@pytest.mark.parametrize("kw", [{"model": None}, {"model": 42}, {"training": 42},
                                {"model": ["gpt3-125m"]}, {"allow_idle_gpus": "no"}])
def test_api_wrong_types_are_spec_errors(kw):
    args = {"model": "gpt3-125m", "cluster": "dgx-h100", "gpus": 8, "global_batch_size": 64,
            **kw}
    _one_line(api.plan, **args)


def test_api_numpy_integers_are_accepted():
    r = api.plan("gpt3-125m", "dgx-h100", gpus=np.int64(8), global_batch_size=np.int64(16),
                 seq_len=np.int64(1024), tp=1, pp=1)
    assert r.fits_any and r.setup["global_batch_size"] == 16


ATT_HEAD = "batch,heads,seq,head_dim,causal,pass,seconds,tflops\n"


def _cal_with(cal_copy, tmp_path, name, text):
    folder = tmp_path / "h200"
    shutil.copytree(cal_copy, folder)
    (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("name,text", [
    ("gemm.csv", ""), ("gemm.csv", "a,b\n1,2\n"),
    ("gemm.csv", "tokens,hidden,tp,op,layout,m,n,k,seconds,tflops\n1,1,1,qkv,fwd,8,8,8,nan,1\n"),
    ("gemm.csv", "tokens,hidden,tp,op,layout,m,n,k,seconds,tflops\n1,1,1,qkv,fwd,8,8,8,-1,1\n"),
    ("gemm.csv", "tokens,hidden,tp,op,layout,m,n,k,seconds,tflops\n1,1,1,qkv,fwd,8,8,8,0,1\n"),
    ("gemm.csv", "tokens,hidden,tp,op,layout,m,n,k,seconds,tflops\n1,1,1,qkv,fwd,8,8,8,abc,1\n"),
    ("attention.csv", ATT_HEAD + "1,8,1024,128,1,fwd,1e-4,1\n"),
    ("attention.csv", ATT_HEAD + "1,8,1024,128,1,fwd,-1e-4,1\n2,8,1024,128,1,fwd,1e-4,1\n"),
    ("env.json", "{"), ("env.json", "[]"), ("env.json", '{"sms": "many"}'),
])
def test_bad_calibration_tables_are_one_line(cal_copy, tmp_path, name, text):
    _one_line(load_calibration, _cal_with(cal_copy, tmp_path, name, text), "h200-sxm-141gb")


def test_non_utf8_calibration_table_is_one_line(cal_copy, tmp_path):
    folder = _cal_with(cal_copy, tmp_path, "gemm.csv", "")
    (folder / "gemm.csv").write_bytes(b"\xff\xfe\x00binary")
    _one_line(load_calibration, folder, "h200-sxm-141gb", match="not UTF-8")


def test_runs_table_tokens_zero_ragged_and_duplicates(tmp_path):
    src = pd.read_csv(Path(calibrate.VALIDATION_DIR) / "training_runs_dev.csv",
                      dtype={"row_id": str}).head(1)
    src.to_csv(tmp_path / "one.csv", index=False)
    pd.concat([src, src]).to_csv(tmp_path / "two.csv", index=False)
    assert len(calibrate.read_runs(tmp_path / "two.csv")) == 1  # one run, not two
    zero = src.assign(seconds_per_iteration=np.nan, tokens_per_sec_per_gpu=0.0,
                      tokens_per_sec_total=np.nan)
    zero.to_csv(tmp_path / "zero.csv", index=False)
    cases, skipped = calibrate.runs_to_cases(calibrate.read_runs(tmp_path / "zero.csv"))
    assert not cases and all("\n" not in why for _, why in skipped)
    text = (tmp_path / "one.csv").read_text().splitlines()
    (tmp_path / "ragged.csv").write_text(text[0] + "\nr1,x,2\n")
    cases, skipped = calibrate.runs_to_cases(calibrate.read_runs(tmp_path / "ragged.csv"))
    assert not cases and skipped and all("\n" not in why for _, why in skipped)


def test_search_size_is_refused_up_front_with_how_to_narrow():
    m, t, c = load_model("gpt3-125m"), load_training(global_batch_size=14414400,
                                                      seq_len=2048), load_cluster("dgx-h100",
                                                                                  2**20)
    space = make_space(m, t, c, allow_idle_gpus=True)
    msg = _one_line(check_search_size, space, match="narrow the search")
    assert "--tp" in msg
    small = make_space(m, load_training(global_batch_size=64, seq_len=2048),
                       load_cluster("dgx-h100", 8))
    assert check_search_size(small) == sum(f.size for f in small.iter_chunks())


def test_realtime_too_many_models_is_one_line():
    data = {"devices": [{"name": "d", "peak_tflops": 1.0, "memory_gib": 1.0,
                         "mem_bw_gbyte_per_s": 1.0}],
            "models": [{"name": f"m{i}", "gflops": 1.0, "weights_mib": 1.0, "layers": 1,
                        "latency_ms": 10.0, "priority": i} for i in range(1000)]}
    _one_line(load_realtime, data, match="at most 256")


def test_iter_chunks_checks_prefixes_in_bounded_blocks(monkeypatch):
    """The same configurations, in the same order, whatever the prefix block size (the whole
    tp x pp x cp x dp x vp product was built in memory)."""
    space = make_space(load_model("gpt3-125m"), load_training(global_batch_size=64,
                                                              seq_len=2048),
                       load_cluster("dgx-h100", 64), allow_idle_gpus=True)
    whole = np.concatenate(list(space.iter_chunks()))
    monkeypatch.setattr(space_module, "PREFIX_BLOCK", 7)
    assert np.array_equal(np.concatenate(list(space.iter_chunks())), whole)
    assert space.pruned_size() == whole.size
