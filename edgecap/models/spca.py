"""SPCA, Structure Preserving Convolutional Attention: an LSTM decoder that attends with convolutions on the 2D grid.

Every step builds F_t = [V; tile(h_{t-1})] on the (side x side) feature map and derives a spatial map
M^S = sigmoid(Conv(ReLU(Conv(F_t)))) (1 x side x side) and a channel map M^C = sigmoid(W_2 ReLU(W_1 avgpool(F_t)))
(D x 1 x 1); the context C_t = V * M^C * M^S is mean-pooled to a vector for the LSTM and the deep output layer.
Both first layers are linear in F_t, so each splits into an image half, computed once per image by ``prepare``,
and an h half, the only part a step computes (for the variants where the branch sees the raw V).

Modules only; the step contract is SAT's (docs/design.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from edgecap import spec
from edgecap.models.output import DecoderOutput, per_caption

MEMORY_SPATIAL = "memory.spatial_proj"  # float32 [N, A, side, side]: Conv_V(V), the image half of the first k x k conv
MEMORY_CHANNEL = "memory.channel_proj"  # float32 [N, R]: W_1V avgpool(V) + b, the image half of the channel squeeze

VARIANTS = ("S", "C", "C-S", "S-C", "S|C")  # the paper's Table 2: one branch, either order in sequence, parallel
KERNEL_SIZES = (1, 3, 5)


@dataclass(frozen=True)
class SPCAConfig:
    vocab_size: int  # words including the four specials
    feature_dim: int = 1280  # channels C of the encoder grid
    annotation_dim: int = 512  # channels D of V = ReLU(W_f f) (0: use the grid as is)
    num_locations: int = 49  # grid cells L = side * side
    embed_dim: int = 512  # word embedding E y
    hidden_dim: int = 512  # LSTM h and c
    att_dim: int = 512  # channels A between the two k x k convs of the spatial branch
    reduction: int = 16  # channel branch squeeze ratio r: (D + H) -> (D + H) // r -> D
    kernel_size: int = 3  # k of both spatial convs (padding k // 2)
    variant: str = "S|C"  # one of VARIANTS: S, C, C-S (channel then spatial), S-C, S|C (parallel)
    dropout: float = 0.5  # on h_t before the deep output layer

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"SPCA variant '{self.variant}' is not one of {', '.join(VARIANTS)}")
        if self.kernel_size not in KERNEL_SIZES:
            raise ValueError(f"SPCA kernel_size {self.kernel_size} is not one of {', '.join(map(str, KERNEL_SIZES))}")
        if math.isqrt(self.num_locations) ** 2 != self.num_locations:
            raise ValueError(f"SPCA num_locations {self.num_locations} is not a square grid (side * side)")
        if self.reduction < 1:
            raise ValueError(f"SPCA reduction {self.reduction} must be >= 1")


def _grid(features: torch.Tensor) -> torch.Tensor:
    """(N, L, D) row-major grid vectors -> (N, D, side, side); L is static (only N is dynamic), so side is too."""
    side = math.isqrt(features.shape[1])
    if side * side != features.shape[1]:
        raise ValueError(f"SPCA needs a square grid; got {features.shape[1]} locations")
    return features.transpose(1, 2).unflatten(2, (side, side))


def tap_coverage(side: int, kernel_size: int) -> torch.Tensor:
    """(k*k, side*side): 1 where tap (dy, dx) of a zero-padded k x k conv centred on a cell lands inside the grid."""
    identity = torch.eye(kernel_size * kernel_size).view(-1, 1, kernel_size, kernel_size)
    ones = torch.ones(1, 1, side, side)
    return nn.functional.conv2d(ones, identity, padding=kernel_size // 2).view(kernel_size * kernel_size, -1)


class SpatialAttention(nn.Module):
    """M^S = sigmoid(Conv_2(ReLU(Conv_1([V; tile(h)])))), with Conv_1([V; tile(h)]) = Conv_V(V) + Conv_h(tile(h)).

    Conv_h of a constant map is, at each cell, the sum of its in-grid taps' W_tap h: one (A*k*k)-linear of h and a
    fixed tap-coverage matmul, instead of a k x k conv over the tiled map every step.
    """

    def __init__(self, feature_dim: int, hidden_dim: int, att_dim: int, kernel_size: int, side: int):
        super().__init__()
        self.conv_v = nn.Conv2d(feature_dim, att_dim, kernel_size, padding=kernel_size // 2)
        self.conv_h = nn.Linear(hidden_dim, att_dim * kernel_size * kernel_size, bias=False)  # (a, dy, dx) order
        self.conv_out = nn.Conv2d(att_dim, 1, kernel_size, padding=kernel_size // 2)
        self.register_buffer("coverage", tap_coverage(side, kernel_size), persistent=False)

    def project(self, grid: torch.Tensor) -> torch.Tensor:
        """The image half: V (N, D, side, side) -> (N, A, side, side)."""
        return self.conv_v(grid)

    def forward(self, v_proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """v_proj (N, A, side, side), h (N, H) -> M^S flattened (N, L), each in [0, 1]."""
        h_term = self.conv_h(h).unflatten(1, (v_proj.shape[1], -1)) @ self.coverage  # (N, A, L)
        hidden = torch.relu(v_proj + h_term.unflatten(2, v_proj.shape[2:]))
        return torch.sigmoid(self.conv_out(hidden)).flatten(1)


class ChannelAttention(nn.Module):
    """M^C = sigmoid(W_2 ReLU(W_1 avgpool([V; tile(h)]))): avgpool of tile(h) is h, and 1x1 convs on 1x1 are linears."""

    def __init__(self, feature_dim: int, hidden_dim: int, reduction: int):
        super().__init__()
        squeezed = max(1, (feature_dim + hidden_dim) // reduction)
        self.squeeze_v = nn.Linear(feature_dim, squeezed)
        self.squeeze_h = nn.Linear(hidden_dim, squeezed, bias=False)
        self.excite = nn.Linear(squeezed, feature_dim)

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """The image half: avgpool(V) (N, D) -> (N, R)."""
        return self.squeeze_v(pooled)

    def forward(self, v_proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """v_proj (N, R), h (N, H) -> M^C (N, D), each in [0, 1]."""
        return torch.sigmoid(self.excite(torch.relu(v_proj + self.squeeze_h(h))))


class SPCA(nn.Module):
    def __init__(self, config: SPCAConfig):
        super().__init__()
        self.config = c = config
        d = c.annotation_dim or c.feature_dim
        self.annotate = nn.Linear(c.feature_dim, d) if c.annotation_dim else None
        self.embed = nn.Embedding(c.vocab_size, c.embed_dim)
        self.init_h = nn.Linear(d, c.hidden_dim)
        self.init_c = nn.Linear(d, c.hidden_dim)
        side = math.isqrt(c.num_locations)
        self.spatial = SpatialAttention(d, c.hidden_dim, c.att_dim, c.kernel_size, side) if "S" in c.variant else None
        self.channel = ChannelAttention(d, c.hidden_dim, c.reduction) if "C" in c.variant else None
        self.lstm = nn.LSTMCell(c.embed_dim + d, c.hidden_dim)
        self.dropout = nn.Dropout(c.dropout)
        self.out_h = nn.Linear(c.hidden_dim, c.embed_dim)  # L_h
        self.out_z = nn.Linear(d, c.embed_dim)  # L_z
        self.out = nn.Linear(c.embed_dim, c.vocab_size)  # L_o

    def prepare(self, features: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Grid features (N, L, C) -> (memory, initial state), named as in ``edgecap.spec`` and this module.

        A branch's image half is memory only where that branch sees the raw V (not C-S's spatial, not S-C's channel).
        """
        if self.annotate is not None:
            features = torch.relu(self.annotate(features))
        mean = features.mean(dim=1)
        memory = {spec.MEMORY_FEATURES: features}
        if self.spatial is not None and self.config.variant != "C-S":
            memory[MEMORY_SPATIAL] = self.spatial.project(_grid(features))
        if self.channel is not None and self.config.variant != "S-C":
            memory[MEMORY_CHANNEL] = self.channel.project(mean)
        state = {spec.STATE_H: torch.tanh(self.init_h(mean)), spec.STATE_C: torch.tanh(self.init_c(mean))}
        return memory, state

    def _attend(self, memory: dict[str, torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h_{t-1} (N, H) -> (context: mean over cells of V * M^C * M^S (N, D), M^S (N, L); uniform 1/L without S)."""
        features = memory[spec.MEMORY_FEATURES]
        variant = self.config.variant
        spatial = channel = None
        if variant == "C-S":  # the spatial branch sees the channel-attended map
            channel = self.channel(memory[MEMORY_CHANNEL], h)
            spatial = self.spatial(self.spatial.project(_grid(features * channel.unsqueeze(1))), h)
        elif variant == "S-C":  # the channel branch pools the spatially attended map
            spatial = self.spatial(memory[MEMORY_SPATIAL], h)
            pooled = torch.bmm(spatial.unsqueeze(1), features).squeeze(1) / features.shape[1]
            channel = self.channel(self.channel.project(pooled), h)
        else:
            if self.spatial is not None:
                spatial = self.spatial(memory[MEMORY_SPATIAL], h)
            if self.channel is not None:
                channel = self.channel(memory[MEMORY_CHANNEL], h)
        if spatial is None:
            spatial = torch.ones_like(features[..., 0]) / features.shape[1]
            context = features.mean(dim=1)
        else:  # mean_i(V_i * M^S_i) without materialising V * M^S
            context = torch.bmm(spatial.unsqueeze(1), features).squeeze(1) / features.shape[1]
        if channel is not None:
            context = context * channel
        return context, spatial

    def _advance(self, y: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor]):
        """Embedded words y (N, E) -> (logits (N, V), new state, attention (N, L))."""
        h, c = state[spec.STATE_H], state[spec.STATE_C]
        z, attention = self._attend(memory, h)
        h, c = self.lstm(torch.cat([y, z], dim=-1), (h, c))
        logits = self.out(y + self.out_h(self.dropout(h)) + self.out_z(z))
        return logits, {spec.STATE_H: h, spec.STATE_C: c}, attention

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor],
             position: torch.Tensor):
        """tokens (N,) -> (log-probs (N, V), new state, attention (N, L): the spatial map M^S).

        ``position`` (int64 scalar) is unused: the LSTM state already carries it.
        """
        logits, state, attention = self._advance(self.embed(tokens), state, memory)
        return torch.log_softmax(logits, dim=-1), state, attention

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, *,
                rows: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: features (B, L, C), tokens (B, T) starting with bos.

        ``rows`` (B,) is each caption's photo when features hold one row per photo (``per_caption``).

        Returns ``logprobs`` (B, T, V) and ``attention`` (B, T, L). The map is a sigmoid, not a softmax, so the
        doubly stochastic regulariser, which assumes rows that sum to one, leaves it alone.
        """
        memory, state = self.prepare(features)
        memory, state = per_caption(memory, rows), per_caption(state, rows)
        embedded = self.embed(tokens)
        logprobs, attentions = [], []
        for t in range(tokens.shape[1]):
            logits, state, attention = self._advance(embedded[:, t], state, memory)
            logprobs.append(torch.log_softmax(logits, dim=-1))
            attentions.append(attention)
        return DecoderOutput(torch.stack(logprobs, 1), torch.stack(attentions, 1))
