"""The operands every activation term starts from (Korthikanti et al. 2022's ``s b h`` terms
with tensor / sequence parallelism and the bytes per value)."""

from __future__ import annotations

import numpy as np


def activation_operands(tp, sequence_parallel, seq_len, micro_batch_size, bytes_per_value,
                        gemm_input_bytes):
    """The operands the per-layer activation terms share: ``t`` (tp as float), ``r`` (the
    divisor of the sequence-parallel parts: ``t`` with sequence parallelism, else 1), ``sb``
    (tokens of the micro-batch on this GPU, ``s*b``), ``e`` (bytes per saved value) and ``gi``
    (bytes per GEMM input value, ``e`` unless fp8 inputs are kept), as in Korthikanti et al. 2022
    (arXiv:2205.05198) Eq. 1-2. Example: tp 4 with sp, s 2048, b 2, bf16: (4, 4, 4096, 2, 2)."""
    t = np.asarray(tp, dtype=np.float64)
    r = np.where(np.asarray(sequence_parallel, dtype=bool), t, 1.0)
    sb = np.asarray(seq_len, dtype=np.float64) * np.asarray(micro_batch_size, dtype=np.float64)
    e = float(bytes_per_value)
    gi = e if gemm_input_bytes is None else float(gemm_input_bytes)
    return t, r, sb, e, gi
