"""The tuned-recipe check's miss split (validation.validate_moe.tuned_miss_kind)."""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from validation.validate_moe import moe_tuned_summary, print_moe_tuned, tuned_miss_kind


def test_miss_kinds_by_hand():
    # E0003-like: measured 14.47 s, recipe predicted 11.38 s (-21.4 %), gain 1.056
    assert tuned_miss_kind(14.47, 11.38, 1.056) == "recipe"
    # E0024-like: recipe predicted 19.44 s against 20.81 s (-6.6 %), gain 1.198
    assert tuned_miss_kind(20.81, 19.44, 1.198) == "gain"
    # E0046-like: -40.7 % and a 1.24x gain
    assert tuned_miss_kind(48.71, 28.90, 1.24) == "both"
    # Grok-1 fp8-like: -6.6 % and 1.082: each inside its band, the product 1.158 is not
    assert tuned_miss_kind(16.69, 15.59, 1.082) == "split"
    # the bands' edges belong inside: exactly 10 % off, exactly 1.15x
    assert tuned_miss_kind(10.0, 9.0, 1.15) == "split"


def _row(model, measured, recipe, gain):
    best = recipe / gain
    ratio = measured / best
    return {"model": model, "gpu": "H100-SXM5-80GB", "gpus": 64, "global_batch": 512,
            "precision": "fp8", "measured_s": measured, "predicted_best_s": best,
            "ratio": ratio, "recipe_predicted_s": recipe, "search_gain": gain,
            "best_config": "t1 p1 v1 cp1 ep8 etp1 d64 b1 none", "gain_term": "compute",
            "gain_term_s": recipe - best, "recipe_microbatches": 8, "best_microbatches": 8,
            "ok": 0.90 <= ratio <= 1.15}


def test_summary_counts_and_prints_the_split():
    t = pd.DataFrame([_row("a", 10.0, 9.8, 1.02),    # ratio 1.04: inside
                      _row("b", 14.47, 11.38, 1.056),  # recipe
                      _row("c", 20.81, 19.44, 1.198),  # gain
                      _row("d", 16.69, 15.59, 1.082)])  # split
    s = moe_tuned_summary(t)
    assert s["within"] == 1 and s["settings"] == 4
    assert s["misses_by_kind"] == {"recipe": 1, "gain": 1, "both": 0, "split": 1}
    out = Console(record=True, width=250)
    print_moe_tuned(out, t)
    text = out.export_text()
    assert "1 of 4 settings within [0.90, 1.15] (25%); outside: 1 the recipe's own time off" in text
    assert "-21.4%" in text and "1.20" in text  # recipe error and gain columns
