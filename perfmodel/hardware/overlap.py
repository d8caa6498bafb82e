"""What overlapping communication with compute costs the compute.

NCCL kernels run on streaming multiprocessors and move data through HBM while the GEMMs they hide
behind run: compute that overlaps communication runs slower. We model it as Calculon does: while a
collective is in flight, the compute it overlaps is stretched by ``1 + slowdown`` (Calculon's
``processor_usage`` reserves a share of the processor for communication; Galvatron measures a
1.1-1.3x slowdown of overlapped compute on A100). The extra time is

    ``slowdown * min(hidden communication, compute it overlaps)``

for the data-parallel, ZeRO, pipeline and context-parallel streams (hidden behind the step) and
for tensor-parallel communication hidden behind its layer's GEMMs (Transformer Engine userbuffers,
which take SMs as well).

The slowdown is a property of the GPU generation (SM count, copy engines, HBM bandwidth relative
to compute). :data:`OVERLAP_SLOWDOWN` holds one value per generation; a GPU spec's
``comm_overlap_slowdown`` overrides it. The Hopper and Blackwell values are fitted on the dev split
of published runs (``benchmarks/fit_time_model.py``: least squares on log step-time ratio, with
leave-one-source-out cross-validation, see docs/compute.md); Ampere and older keep the middle of
Galvatron's range, since their published runs (Megatron-LM 2020-2022) did not overlap.

References
----------
Isaev et al. 2023, "Calculon: a Methodology and Tool for High-Level Codesign of Systems and Large
Language Models", SC23, Sec. 3.3 (``processor_usage`` of overlapped communication); Miao et al.
2022, "Galvatron", VLDB, Sec. 4.2 (overlap slowdown coefficient 1.1-1.3); Rashidi et al. 2021
(ASTRA-sim), compute-communication interference.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.spec.specs import GPUSpec

__all__ = ["OVERLAP_SLOWDOWN", "gpu_generation", "overlap_slowdown_for", "overlap_slowdown_s"]

#: Fractional slowdown of compute while overlapped communication runs, per GPU generation.
#: hopper: fitted (benchmarks/fit_time_model.py, dev split, NeMo / Megatron-Bridge rows);
#: blackwell: Hopper's value, as the fit script uses it when it fits each Blackwell part's
#: sustained GEMM fraction (too few Blackwell rows to separate the two; this table held 0.20
#: while the fractions were fitted at 0.05, which left the Blackwell rows 1-3 % slow);
#: ampere / volta / cdna3: Galvatron's mid-range 1.2x (Miao et al. 2022, Sec. 4.2).
OVERLAP_SLOWDOWN = {
    "volta": 0.20,
    "ampere": 0.20,
    "hopper": 0.05,
    "blackwell": 0.05,
    "cdna3": 0.20,
    "other": 0.20,
}

_GENERATION_BY_NAME = (  # (substring of the GPU name, generation); first match
    ("GB3", "blackwell"), ("GB2", "blackwell"), ("B200", "blackwell"), ("B300", "blackwell"),
    ("H100", "hopper"), ("H200", "hopper"), ("H800", "hopper"), ("H20", "hopper"),
    ("A100", "ampere"), ("A800", "ampere"), ("A10", "ampere"), ("V100", "volta"),
    ("MI300", "cdna3"), ("MI325", "cdna3"),
)


_GENERATION_BY_CC_MAJOR = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell"}


def gpu_generation(gpu: GPUSpec) -> str:
    """Architecture generation of a GPU (``hopper``, ``blackwell``, ...; ``other`` when
    unknown): from its ``compute_capability`` where the spec states one (NVIDIA's CUDA GPUs
    list: 7.x Volta, 8.0 / 8.6 Ampere, 9.0 Hopper, 10.x Blackwell; Ada's 8.9 by name), else from
    its name."""
    cc = gpu.compute_capability_tuple
    if cc is not None and cc != (8, 9) and cc[0] in _GENERATION_BY_CC_MAJOR:
        return _GENERATION_BY_CC_MAJOR[cc[0]]
    name = gpu.name.upper()
    for key, gen in _GENERATION_BY_NAME:
        if key in name:
            return gen
    return "other"


def overlap_slowdown_for(gpu: GPUSpec) -> float:
    """The GPU's ``comm_overlap_slowdown`` when its spec gives one, else its generation's."""
    own = getattr(gpu, "comm_overlap_slowdown", None)
    if own is not None:
        return float(own)
    return OVERLAP_SLOWDOWN[gpu_generation(gpu)]


def overlap_slowdown_s(hidden_comm_s: ArrayLike, compute_s: ArrayLike, slowdown: float) -> np.ndarray:
    """Extra compute time [s] from running ``compute_s`` of work next to ``hidden_comm_s`` of
    communication it hides: ``slowdown * min(hidden, compute)``.

    Example: 0.4 s of gradient reduce-scatter hidden behind a 3 s step at slowdown 0.2 costs
    0.08 s; hidden communication longer than the compute only slows the compute it overlaps.

    References
    ----------
    Isaev et al. 2023 (Calculon), Sec. 3.3; Miao et al. 2022 (Galvatron), Sec. 4.2.
    """
    hidden = np.maximum(np.asarray(hidden_comm_s, dtype=np.float64), 0.0)
    comp = np.maximum(np.asarray(compute_s, dtype=np.float64), 0.0)
    return slowdown * np.minimum(hidden, comp)
