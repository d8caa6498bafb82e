"""Multi-token prediction (DeepSeek-V3): the extra work of the last pipeline stage.

Megatron-Core's ``MultiTokenPredictionBlock`` (``megatron/core/transformer/
multi_token_prediction.py``; Megatron-Bridge DeepSeek-V3 recipes set ``mtp_num_layers = 1``)
runs, per MTP depth and micro-batch, on the pipeline stage that holds the loss: the embedding of
the tokens shifted by one, two RMSNorms (``enorm``, ``hnorm``) and their concatenation, the
``eh_proj`` linear ``2h -> h``, one transformer layer of the decoder's spec (for DeepSeek-V3 MLA
and MoE), a final norm, and the logits and cross-entropy of the shared output layer again. So
the last stage does, per MTP layer, one more layer, a second loss head and a GEMM of
``2h*h / (h*V) = 2h/V`` of the logits GEMM's FLOPs (DeepSeek-AI 2024, DeepSeek-V3 report,
Sec. 2.2, Fig. 3).

Megatron-Bridge's pipeline layouts give that stage fewer decoder layers in return (e.g.
``(16, 1)``: ``[embedding + 4 decoder]``, 14 x ``[4 decoder]``, ``[1 decoder + mtp + loss]``;
``recipes/deepseek/deepseek_v3.py`` ``layout_map``), which the configuration's ``stage_layers``
express; whether the last stage then paces the pipeline follows from the stage times.
"""

from __future__ import annotations

import numpy as np

from perfmodel.spec.specs import ModelSpec

__all__ = ["mtp_stage_s"]


def mtp_stage_s(model: ModelSpec, layer_s, logits_s) -> np.ndarray:
    """Time the MTP layers add to the last pipeline stage per micro-batch [s], forward and
    backward: ``mtp_num_layers * (layer + (1 + 2h/V) * logits)``: the MTP transformer layer at
    the decoder's average layer time ``layer_s`` (its MoE dispatch included), the second logits
    + loss at ``logits_s``, and the ``eh_proj`` GEMM (``2h -> h`` over the same tokens and the
    same tensor-parallel split as the output layer) at ``2h/V`` of the logits time; the two norms
    and the shifted embedding are memory-bound and small against these.

    References
    ----------
    Megatron-Core ``multi_token_prediction.py`` (``MultiTokenPredictionLayer.forward``:
    ``enorm``, ``hnorm``, ``eh_proj``, ``transformer_layer``, ``final_layernorm``;
    ``process_mtp_loss``: ``output_layer`` and cross-entropy per depth); DeepSeek-AI 2024
    (DeepSeek-V3 report), Sec. 2.2.
    """
    n = float(model.mtp_num_layers)
    eh_over_logits = 2.0 * model.hidden_size / model.vocab_size
    return n * (np.asarray(layer_s, dtype=np.float64)
                + (1.0 + eh_over_logits) * np.asarray(logits_s, dtype=np.float64))
