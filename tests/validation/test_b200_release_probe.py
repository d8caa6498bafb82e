"""The what-ifs of benchmarks/b200_release_probe.py (docs/moe.md "The 25.x B200 rows against their
26.x siblings"), checked with hand-computed numbers; the model itself is not changed by them."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from validation.validate import VALIDATION_DIR

ROOT = Path(__file__).resolve().parents[2]


def _probe():
    path = ROOT / "benchmarks" / "b200_release_probe.py"
    if not path.exists():
        pytest.skip("benchmarks/b200_release_probe.py not in this checkout")
    spec = importlib.util.spec_from_file_location("b200_release_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_distinct_ranks_by_hand():
    p = _probe()
    # DeepSeek-V3 at ep 8: one group of 8 per rank, 4 chosen -> 8 * (1 - C(7,4)/C(8,4)) = 4
    assert p.distinct_ranks(256, 8, 8, groups=8, group_topk=4) == pytest.approx(4.0)
    # two experts, top-1, ep 2: a token always reaches exactly one rank
    assert p.distinct_ranks(2, 1, 2) == pytest.approx(1.0)
    # 4 experts, top-2, ep 2 (2 a rank): P(both on one rank) = 2 / C(4,2) = 1/3 -> 2 - 1/3
    assert p.distinct_ranks(4, 2, 2) == pytest.approx(5.0 / 3.0)


def test_e0035_preset_reading_is_a_what_if():
    """As published (ep 8) E0035 stays about 21 % fast; read as the v0.2.1 B200 preset (ep 64 +
    layernorm / moe_act) it is within 5 % and its tokens/s equal E0055's within 3 %."""
    p = _probe()
    df = pd.read_csv(VALIDATION_DIR / "moe_runs_dev.csv")
    t = p.gptoss_preset_table(df).set_index("reading")
    assert t.loc["as published: ep 8", "error"] == pytest.approx(-0.205, abs=0.03)
    assert abs(t.loc["preset v0.2.1: ep 64 + layernorm/moe_act", "error"]) < 0.05
    e55 = t[t["row"] == "E0055"]["tok_s_gpu"].iloc[0]
    assert t.loc["as published: ep 8", "tok_s_gpu"] / e55 == pytest.approx(1.0, abs=0.03)
