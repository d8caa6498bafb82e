"""Issue 13 accuracy targets on the dev split (hardware_specs/validation/training_runs_dev.csv).

- published runs: step-time MAPE <= 7 %; every group (source x GPU type x precision) with a mean
  signed error within +-7 %, except the groups listed in KNOWN_GROUP_BIAS with the bound they are
  held to and the reason (README, accuracy section);
- tuned recipes: a free search per vendor-recipe setting (model, GPU type, GPU count, global batch,
  sequence, precision) returns a best predicted time T with 0.90 <= measured / T <= 1.15 in at
  least 90 % of the settings;
- the Nemotron-4 340B NeMo recipe (128 H100, tp8 pp8 vp12) is faster in FP8 than in BF16, as
  measured (3.16 s vs 4.61 s).
"""

import pytest

from search.validate import group_table, summary, training_runs_report, tuned_report

# (source, GPU, precision) -> largest |bias| accepted, and why it is above 7 %.
KNOWN_GROUP_BIAS: dict[tuple[str, str, str], float] = {
    # 4 single-node 2020 rows; V100 has no measured calibration or published matmul ceiling: the
    # H200 efficiency curve transferred by datasheet peak makes it 14 % slow.
    ("Megatron-LM README 2020", "V100-SXM3-32GB", "fp16"): 0.15,
    # One constant per part is fitted across releases; Megatron-Bridge 25.11 runs GB200 faster
    # than 25.09 at the same layouts (3 rows, +9 %), and 25.09 on H100 (3 rows, +7.1 %) runs
    # Llama 3 faster per token than NeMo 24.09 (60 rows) does. Per-release profiles: issue 17.
    ("Megatron-Bridge 25.11", "GB200", "fp8-cs"): 0.10,
    ("Megatron-Bridge 25.09", "H100-SXM5-80GB", "fp8-cs"): 0.10,
}


@pytest.fixture(scope="module")
def report():
    return training_runs_report()[0]


def test_dev_split_mape(report):
    s = summary(report)
    assert s["mape"] <= 0.07, s


def test_group_bias(report):
    g = group_table(report)
    bad = []
    for r in g.itertuples():
        bound = KNOWN_GROUP_BIAS.get((r.source, r.gpu_type, r.precision), 0.07)
        if abs(r.bias) > bound:
            bad.append(f"{r.source} / {r.gpu_type} / {r.precision}: {r.bias:+.1%} ({r.rows} rows)")
    assert not bad, "\n".join(bad) + "\n" + g.to_string()


def test_nemotron_340b_fp8_faster_than_bf16(report):
    r = report.set_index("row_id")
    bf16, fp8 = r.loc["R0242", "predicted_s"], r.loc["R0247", "predicted_s"]
    assert fp8 < bf16
    assert bf16 / fp8 == pytest.approx(4.61 / 3.16, rel=0.12)


@pytest.mark.slow
def test_tuned_recipes():
    t = tuned_report()
    ok = t["ratio"].between(0.90, 1.15)
    assert len(t) >= 40
    assert ok.mean() >= 0.90, t[~ok].to_string()
