"""Where the expert-parallel groups sit: Megatron-Core's rank layout of the MoE groups with and
without MoE parallel folding.

**Folded** (Megatron-Core >= 0.10, ``expert_tensor_parallel_size``): the experts of a pipeline
stage get their own rank generator, order ``tp-ep-dp-pp`` over ``etp x ep x expert-dp`` on the
same ``tp*cp*dp`` GPUs as the attention. Innermost first:

* expert tensor parallel (etp): ``etp`` ranks, stride 1;
* expert parallel (ep): ``ep`` ranks, stride ``etp``; etp x ep: ``ep*etp`` ranks, stride 1;
* expert data parallel: ``tp*cp*dp / (ep*etp)`` ranks, stride ``ep*etp``.

**Before folding** (Megatron-Core 0.8 / 0.9, NeMo 24.07 / 24.09): one rank generator, order
``tp-cp-ep-dp-pp``; the expert groups use it with ``independent_ep=True``, where ``dp`` is split
into ``ep x dp/ep`` (``RankGenerator.ordered_size_w_ep``: ``dp // ep``), and the experts are
split by the attention's tensor-parallel group (etp = tp). So ep is carved out of the
data-parallel ranks, *outside* tp and cp:

* expert tensor parallel = the tp group: ``tp`` ranks, stride 1;
* expert parallel (``'ep'``): ``ep`` ranks, stride ``tp*cp``;
* tensor + expert (``'tp-ep'``, the all-gather dispatcher's group): ``tp`` ranks stride 1 times
  ``ep`` ranks stride ``tp*cp`` (contiguous only when cp = 1);
* expert data parallel with cp (``'dp-cp'``, the expert gradients' group in
  ``DistributedDataParallel`` and the distributed optimizer): ``cp`` ranks stride ``tp`` times
  ``dp/ep`` ranks stride ``tp*cp*ep``: ``cp*dp/ep`` GPUs, the same count as folded.

With cp = 1 and etp = tp both layouts coincide; with cp > 1 the pre-folding ep group is ``cp``
times more spread out (tp 4, cp 2, ep 8 on 8-GPU nodes: one member per node over 8 nodes, where
the folded layout puts two members in each of 4 nodes) and its expert-data-parallel group is
more compact. ``initialize_model_parallel`` of those releases also requires ``ep | dp`` (not
``ep*etp | tp*cp*dp``): "data_parallel_size ... is not divisible by expert_model_parallel_size".

The all-to-all dispatcher of those releases with tp > 1 first exchanges the sequence-parallel
slices over tp (``all_to_all_sp2hp``: ``[S*B/tp, h] -> [S*B, h/tp]``), all-to-alls the routed
copies (``tp*T*k`` rows of ``h/tp``: the same bytes as the folded ``T*k`` rows of ``h``) over
ep, all-gathers the hidden dimension over tp (the folded etp gather's bytes), and reverses all
three to combine (``all_to_all_hp2sp``): one tp all-to-all of ``T*h`` values more per dispatch
and per combine than the folded dispatcher (:func:`sp2hp_all_to_all_bytes`).

DeepSpeed-MoE (``deepspeed/utils/groups.py`` ``_create_expert_and_data_parallel``) also carves
ep out of data parallelism (E + M + D example: tp group [0, 1], ep group [0, 2, 4, 6], expert-dp
[0, 8]): ep stride tp, expert-dp stride ``ep*tp``, which is the folded layout with etp = tp
(DeepSpeed has no context parallelism here), so its preset needs no switch.

References
----------
Megatron-Core 0.8 / 0.9 ``megatron/core/parallel_state.py`` (``initialize_model_parallel``:
``RankGenerator(tp, ep, dp, pp, cp, order="tp-cp-ep-dp-pp")``, groups ``get_ranks('ep' |
'tp-ep' | 'dp-cp', independent_ep=True)``; read in the megatron_core 0.8.0 copy vendored in
PKU-YuanGroup/Open-Sora-Plan ``megatron/core/parallel_state.py`` and a patched 0.9
``initialize_model_parallel`` with ``generator_wrapper``), ``distributed/
distributed_data_parallel.py`` (expert buffers on ``get_data_modulo_expert_parallel_group(
with_context_parallel=True)``), ``transformer/moe/token_dispatcher.py``
(``MoEAlltoAllTokenDispatcher``: ``all_to_all_sp2hp``, ep ``all_to_all``,
``all_gather_last_dim_from_tensor_parallel_region``); Megatron-Core ``moe/README.md`` "MoE
Parallel Folding" (0.10: "the EP group in MoE is a sub-group of DP in Attention" before it).
"""

from __future__ import annotations

import numpy as np

from perfmodel.parallel.config import ConfigBatch
from perfmodel.parallel.topology import GroupPlacement, nested_group_placement
from perfmodel.spec.specs import ClusterSpec

__all__ = ["expert_group_levels", "expert_groups", "sp2hp_all_to_all_bytes"]

Levels = tuple[tuple[np.ndarray, np.ndarray], ...]


def expert_group_levels(batch: ConfigBatch, folding: bool | np.ndarray = True
                        ) -> dict[str, Levels]:
    """The expert groups of each configuration as nested ``(size, stride)`` levels, innermost
    first (:func:`perfmodel.parallel.topology.nested_group_placement`): ``etp``, ``ep``, ``ep_etp``
    (the all-gather dispatcher's group) and ``expert_dp``.

    ``folding`` True: Megatron-Core >= 0.10 (``etp x ep x expert-dp``, order ``tp-ep-dp-pp``);
    False: Megatron-Core 0.8 / 0.9 (order ``tp-cp-ep-dp-pp`` with ep taken from dp, etp = tp);
    see the module docstring. Example (False): tp 4, cp 2, dp 8, ep 8: ep is 8 ranks 8 apart,
    expert-dp 2 ranks 4 apart (times 1 rank 64 apart).
    """
    tp, cp, dp = batch.tp, batch.cp, batch.dp
    ep, etp = batch.ep, batch.etp
    one = np.ones_like(tp)
    fold = np.broadcast_to(np.asarray(folding, dtype=bool), np.shape(tp))

    def pick(a, b):
        return np.where(fold, a, b)

    # pre-folding: etp is the tp group; ep stride tp*cp; expert-dp = cp (stride tp) x dp/ep
    # (stride tp*cp*ep)
    dp_per_ep = np.maximum(dp // np.maximum(ep, 1), 1)
    return {
        "etp": ((pick(etp, tp), one),),
        "ep": ((ep, pick(etp, tp * cp)),),
        "ep_etp": ((pick(ep * etp, tp), one), (pick(one, ep), pick(one, tp * cp))),
        "expert_dp": ((pick(batch.expert_dp, cp), pick(ep * etp, tp)),
                      (pick(one, dp_per_ep), pick(one, tp * cp * ep))),
    }


def expert_groups(cluster: ClusterSpec, batch: ConfigBatch, folding: bool | np.ndarray = True
                  ) -> dict[str, GroupPlacement]:
    """The placed expert groups (``etp``, ``ep``, ``ep_etp``, ``expert_dp``) of
    :func:`expert_group_levels` on the cluster's tiers."""
    out = {}
    for k, lv in expert_group_levels(batch, folding).items():
        # levels of one member everywhere change nothing (the folded layout's second levels)
        kept = tuple(level for level in lv if not np.all(level[0] == 1)) or lv[:1]
        out[k] = nested_group_placement(cluster, kept)
    return out


def sp2hp_all_to_all_bytes(tokens_per_gpu: np.ndarray, hidden_size: int,
                           bytes_per_value: float, batch: ConfigBatch,
                           folding: bool | np.ndarray = True) -> np.ndarray:
    """Buffer [bytes per GPU, NCCL convention] of the tensor-parallel all-to-all the
    pre-folding all-to-all dispatcher runs once per dispatch and once per combine
    (``all_to_all_sp2hp`` / ``all_to_all_hp2sp``): the GPU's ``T`` sequence-parallel tokens of
    ``h`` values, ``T*h*bytes``; 0 with folding, tp = 1 or ep = 1 (where the experts are fed
    like a dense MLP, :func:`perfmodel.moe.experts.uses_dispatcher`).

    References
    ----------
    Megatron-Core 0.8 ``transformer/moe/token_dispatcher.py``
    (``MoEAlltoAllTokenDispatcher.token_permutation``: "hidden_states: [S*B/TP, H] ->
    [S*B, H/TP]" before the expert-parallel all-to-all; ``token_unpermutation``: the reverse).
    """
    on = ~np.asarray(folding, dtype=bool) & (batch.tp > 1) & (batch.ep > 1)
    return np.where(on, np.asarray(tokens_per_gpu, dtype=np.float64) * hidden_size
                    * bytes_per_value, 0.0)
