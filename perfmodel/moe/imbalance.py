"""MoE routing imbalance: the busiest expert sets the critical path of the expert-parallel group.

Routers do not spread tokens evenly: the rank holding the busiest expert runs the most GEMM rows
and receives the most tokens in the all-to-all, and every other rank of the EP group waits for it.
The factor ``F = tokens of the busiest expert / mean tokens per expert`` scales the rows of the
routed experts' GEMMs and the dispatch / combine bytes of the busiest rank
(:mod:`perfmodel.moe.experts` reads it as ``ModelSpec.load_imbalance``). With a capacity factor
``C`` (token dropping, GShard / Switch), an expert never takes more than ``C`` times its balanced
share: ``F_eff = min(F, C)``.

Published measurements of the factor (``MaxVio = F - 1``):

- Switch Transformer (Fedus et al. 2022, JMLR, Sec. 2.2 and Table 1) trains with capacity factors
  1.0-1.25 and drops under 1 % of tokens at 1.25 (so the busiest expert stays under ~1.25 x mean).
- DeepSeek's auxiliary-loss-free balancing (Wang et al. 2024, arXiv:2408.15664, Table 1 / Fig. 3):
  ``MaxVio_batch`` of order 0.1-0.3 with bias balancing, 0.5-0.7+ with an auxiliary loss alone.
- GShard (Lepikhin et al. 2021, Sec. 2.2) sets the expert capacity to 2 x the mean for top-2.

The validation rows (Megatron-Core / NeMo / Bridge benchmarks) run force-balanced dropless routing
(``--moe-router-force-load-balancing``), ``F = 1``, and are planned so (``--moe-imbalance 1``).
A plan takes the model's own value (``moe_load_imbalance``, else the capacity factor) and, for a
dropless model that states none, :data:`TYPICAL_IMBALANCE`, the value of learned,
load-balanced routing (:func:`search.host_sharding.imbalance_defaulted`; the report says so).
"""

from __future__ import annotations

from perfmodel.spec.specs import ModelSpec

__all__ = ["TYPICAL_IMBALANCE", "effective_imbalance", "with_imbalance"]

#: Routing imbalance of learned, load-balanced routing, the value to give ``--moe-imbalance``
#: for a run that does not force balance [1: tokens of the busiest expert / mean tokens per
#: expert, per micro-batch; ``MaxVio + 1``]. 1.25: the capacity factor Switch Transformer
#: trains at with < 1 % dropped tokens (Fedus et al. 2022, JMLR 23, Sec. 2.2 and Table 1), so
#: the busiest expert of auxiliary-loss routing stays near 1.25 x the mean; inside the
#: ``MaxVio_batch`` band of 0.1-0.3 that DeepSeek's auxiliary-loss-free balancing reaches
#: (Wang et al. 2024, arXiv:2408.15664, Table 1 and Fig. 3). Listed in the constants registry
#: (``validation.constants``, ``docs/constants.md``). The plan's default for a dropless model
#: that states no imbalance; the force-balanced benchmark rows are planned at 1.
TYPICAL_IMBALANCE = 1.25


def effective_imbalance(factor: float, capacity_factor: float | None,
                        padded: bool = False) -> float:
    """Busiest-expert rows over the mean that the GEMMs and the all-to-all carry: ``F``, capped
    at the capacity factor ``C`` when tokens are dropped (GShard, Lepikhin et al. 2021, Sec. 2.2:
    an expert takes at most ``C * T k / E`` tokens, the rest overflow); ``C`` itself when every
    expert's input is padded to capacity (``padded``, --moe-pad-expert-input-to-capacity).

    Example: F = 1.5, C = 1.25: 1.25; F = 1.1, C = 1.25, padded: 1.25; F = 1.5, dropless: 1.5."""
    if capacity_factor is None:
        return float(factor)
    if padded:
        return float(capacity_factor)
    return float(min(factor, capacity_factor))


def with_imbalance(model: ModelSpec, factor: float | None, padded: bool = False) -> ModelSpec:
    """``model`` with its routing imbalance set to :func:`effective_imbalance` of ``factor``;
    ``model`` itself for a dense model or ``factor`` None (today's value kept)."""
    if factor is None or not model.is_moe:
        return model
    f = effective_imbalance(factor, model.moe_capacity_factor, padded)
    if model.load_imbalance == f:
        return model
    return model.model_copy(update={"moe_load_imbalance": f})
