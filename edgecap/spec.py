"""The export contract, torch-free: tensor names, roles and the state in -> out pairs.

Names are data, declared once: models write their memory and
state under these keys, the exporter names graph inputs and outputs with them,
and the runtime, calibration and TensorRT profiles read them from the manifest.
"""

from __future__ import annotations

# Step graph inputs that are not state or memory.
TOKENS = "tokens"  # int64 [N]: the previous word of every row
STEP = "step"  # int64 scalar: position of the word being predicted
REORDER = "reorder"  # int64 [N]: parent row of each row; the step gathers state by it

# Step graph outputs.
TOPK_LOGPROBS = "topk_logprobs"  # float32 [N, k]
TOPK_IDS = "topk_ids"  # int64 [N, k]
LOGPROBS = "logprobs"  # float32 [N, V], for teacher-forced parity checks
ATTENTION = "attention"  # float32 [N, L]

# Encoder graph input.
PIXELS = "pixels"  # float32 [N, 3, H, W], normalised by edgecap.preprocess

# Memory (computed once per image) and state (carried step to step), LSTM family.
MEMORY_FEATURES = "memory.features"  # float32 [N, L, D]: annotation vectors a_i
MEMORY_ATT_PROJ = "memory.att_proj"  # float32 [N, L, A]: W_a a_i, so no step recomputes it
STATE_H = "state.h"  # float32 [N, H]
STATE_C = "state.c"  # float32 [N, H]

# Transformer family: a static KV cache written at ``step`` (batch first, like every state, so one gather by
# ``reorder`` and one dynamic axis serve all families), and the image's cross-attention keys/values.
STATE_KV = "state.kv"  # float32 [N, layers, 2, heads, Tmax, d_head]: self-attention keys (0) and values (1)
MEMORY_CROSS_KV = "memory.cross_kv"  # float32 [N, layers, 2, heads, L, d_head]: computed once per image

# GLIED: attribute words predicted once per image by the encoder graph, and what the decoder reads of them.
MEMORY_ATTRIBUTE_IDS = "memory.attribute_ids"  # int64 [N, K]: vocabulary ids of the top-K attribute words
MEMORY_ATTRIBUTE_KV = "memory.attribute_kv"  # float32 [N, layers, 2, heads, K, d_head]: their keys/values
MEMORY_ASPECT = "memory.aspect"  # float32 [N, layers, D]: the global aspect vector, projected per decoder layer

# Roles tagged on every tensor of the manifest.
ROLE_MEMORY, ROLE_STATE, ROLE_OUTPUT = "memory", "state", "output"
BATCH_AXIS = "N"  # the one dynamic dimension: images x beams


def role_of(name: str) -> str:
    """``memory`` / ``state`` / ``output`` from the name's declared prefix."""
    if name.startswith("memory."):
        return ROLE_MEMORY
    if name.startswith("state."):
        return ROLE_STATE
    return ROLE_OUTPUT

NEXT_SUFFIX = ".next"  # step output of an updated state tensor: "state.h" -> "state.h.next"
