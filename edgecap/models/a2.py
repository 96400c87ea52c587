"""A², the Attention-Aligned Transformer (Fei, AAAI 2022): a Transformer captioner whose cross-attention is aligned
by a learnable mask perturbation.

Encoder: the L grid features, projected to d and given a learned location embedding, go through ``layers``
post-norm self-attention layers. Decoder: ``layers`` post-norm layers of masked self-attention (static KV cache),
cross-attention over the encoded grid and a feed-forward block. In decoder layer l, with query q_t (the output of
that layer's self-attention sub-layer, the paper's h^d_t) and per-head cross-attention weights α (N, H, T, L):

    mask          m_t = σ(W^m q_t + b^m)                      one value per head and region, (N, H, T, L)
    perturbed     α^p = normalise(m ⊙ α + (1 − m) ⊙ ᾱ)        ᾱ = mean of α over heads; used by the mask objective only
    aligned       α^m = normalise(α ⊙ e^{1−m})                = softmax(scores + 1 − m): a region the mask finds
                                                                 important (small m) gains weight, up to e times
    fused α^a:
      "max"             normalise(max(α, α^m))
      "moving_average"  (1 − η) α + η α^m                    η = ``eta`` (0.1)
      "exponential"     β_s α^m + (1 − β_s) α, β_s = e^{−s/TP} s the decoding step (the word position, the step
                                                              graph's ``step`` input), TP = ``temperature``: the
                                                              alignment steers the first words most
      "gate" (default)  g α^m + (1 − g) α, g = σ(W^g q_t + b^g) one gate per head and position, (N, H, T, 1)
      "none"            α: the plain Transformer baseline, no mask network, no gate, no auxiliary loss

normalise(x) = x / Σ_L x, so every fused attention is again a distribution over the L regions. The mask network
and the gate run at inference: they are part of the step graph.

Training (one optimiser, one backward): the captioner is trained on α^a with m detached, so the captioning loss
never moves θ^m. The mask network's adversarial objective L(θ^m) = −L_IC(α^p) + λ‖1 − m‖² is computed by a second
teacher-forced pass of the decoder with α^p in place of α^a, run through ``torch.func.functional_call`` with every
parameter except the mask networks' detached: that pass moves θ^m only (towards perturbing the regions whose
perturbation hurts the caption most, at the cost λ‖1 − m‖² per row, head and position, summed over regions and
layers), and the captioner only through the aligned pass. L_IC(α^p) is the perturbed decoder's cross-entropy on
the next words forward() can see (its input tokens shifted by one; the last position, whose word is not given,
is left out; <pad> excluded). ``forward`` returns it, already weighted, as ``auxiliary_loss`` in training mode.

Modules only; the step contract is SAT's (docs/design.md), with a static KV cache as state (``spec.STATE_KV``)
and the image's cross-attention keys/values as memory (``spec.MEMORY_CROSS_KV``), both batch first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from edgecap import spec
from edgecap.models.attention import CachedSelfAttention, EncoderLayer, FeedForward, MultiHeadAttention, sinusoids
from edgecap.models.output import DecoderOutput, per_caption
from edgecap.vocab import PAD

ALIGNMENTS = ("gate", "max", "moving_average", "exponential", "none")


@dataclass(frozen=True)
class A2Config:
    vocab_size: int  # words including the four specials
    feature_dim: int = 1280  # channels C of the encoder grid
    num_locations: int = 49  # grid cells L
    d_model: int = 512  # width d of every layer
    heads: int = 8  # attention heads H (d_model divisible by heads)
    layers: int = 3  # encoder layers and decoder layers (each)
    ff_dim: int = 2048  # hidden width of the feed-forward blocks
    dropout: float = 0.1  # on embeddings, sub-layer outputs, attention weights and feed-forward hidden units
    max_positions: int = 32  # static KV cache length Tmax: decoding steps 0..Tmax-1, i.e. captions < Tmax words
    alignment: str = "gate"  # one of ALIGNMENTS: gate / max / moving_average / exponential / none (plain Transformer)
    eta: float = 0.1  # moving_average: weight η of the aligned attention
    temperature: float = 10.0  # exponential: TP of β_s = exp(-s / TP), s the decoding step
    mask_lambda: float = 0.035  # λ of the mask network's λ‖1 - m‖²

    def __post_init__(self):
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"A2 alignment '{self.alignment}' is not one of {', '.join(ALIGNMENTS)}")
        if self.d_model % self.heads:
            raise ValueError(f"A2 d_model {self.d_model} is not divisible by heads {self.heads}")
        if self.layers < 1 or self.max_positions < 2:
            raise ValueError(f"A2 needs layers >= 1 and max_positions >= 2, got {self.layers} and {self.max_positions}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"A2 eta {self.eta} must lie in [0, 1]")
        if not self.temperature > 0:
            raise ValueError(f"A2 temperature {self.temperature} must be > 0")


def normalise(weights: torch.Tensor) -> torch.Tensor:
    """(..., L) non-negative weights -> a distribution over the last axis."""
    return weights / weights.sum(dim=-1, keepdim=True)


class AlignedCrossAttention(nn.Module):
    """Cross-attention over the image regions with the mask network m and the fusion of α and α^m (module docstring)."""

    def __init__(self, dim: int, heads: int, locations: int, *, alignment: str, eta: float, temperature: float,
                 dropout: float):
        super().__init__()
        self.attention = MultiHeadAttention(dim, heads, dropout)
        self.heads, self.locations = heads, locations
        self.alignment, self.eta, self.temperature = alignment, eta, temperature
        self.mask = nn.Linear(dim, heads * locations) if alignment != "none" else None  # W^m, b^m
        self.gate = nn.Linear(dim, heads) if alignment == "gate" else None  # W^g, b^g

    def perturbation_mask(self, query: torch.Tensor) -> torch.Tensor:
        """m = σ(W^m q + b^m): query (N, T, dim) -> (N, heads, T, L)."""
        m = torch.sigmoid(self.mask(query))
        return m.view(query.shape[0], query.shape[1], self.heads, self.locations).transpose(1, 2)

    def align(self, alpha: torch.Tensor, m: torch.Tensor, query: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """α^a from α and m (N, heads, T, L), the query (N, T, dim) and the decoding step of each position (T,)."""
        aligned = normalise(alpha * torch.exp(1 - m))
        if self.alignment == "max":
            return normalise(torch.maximum(alpha, aligned))
        if self.alignment == "moving_average":
            return (1 - self.eta) * alpha + self.eta * aligned
        if self.alignment == "exponential":
            beta = torch.exp(-steps.to(alpha.dtype) / self.temperature).view(1, 1, -1, 1)
            return beta * aligned + (1 - beta) * alpha
        gate = torch.sigmoid(self.gate(query)).transpose(1, 2).unsqueeze(-1)  # (N, heads, T, 1)
        return gate * aligned + (1 - gate) * alpha

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, steps: torch.Tensor, *,
                perturb: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """query (N, T, dim); keys/values (N, heads, L, head_dim); steps (T,) int64.

        Returns the output (N, T, dim), the weights used (N, heads, T, L): α^a, or α^p with ``perturb``, and m
        (N, heads, T, L) (None without alignment).
        """
        alpha = self.attention.weights(query, keys)
        if self.mask is None:
            return self.attention.combine(alpha, values), alpha, None
        m = self.perturbation_mask(query)
        if perturb:
            weights = normalise(m * alpha + (1 - m) * alpha.mean(dim=1, keepdim=True))
        else:
            weights = self.align(alpha, m.detach(), query, steps)  # the captioning loss never trains θ^m
        return self.attention.combine(weights, values), weights, m


class DecoderLayer(nn.Module):
    """Post-norm masked self-attention, aligned cross-attention and feed-forward; teacher-forced or one cached step."""

    def __init__(self, config: A2Config):
        super().__init__()
        c = config
        self.self_attention = CachedSelfAttention(c.d_model, c.heads, c.dropout)
        self.cross_attention = AlignedCrossAttention(c.d_model, c.heads, c.num_locations, alignment=c.alignment,
                                                     eta=c.eta, temperature=c.temperature, dropout=c.dropout)
        self.feed_forward = FeedForward(c.d_model, c.ff_dim, c.dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(c.d_model) for _ in range(3))
        self.dropout = nn.Dropout(c.dropout)

    def _cross_and_feed_forward(self, x: torch.Tensor, cross_kv: torch.Tensor, steps: torch.Tensor, perturb: bool):
        attended, weights, m = self.cross_attention(x, cross_kv[:, 0], cross_kv[:, 1], steps, perturb=perturb)
        x = self.norm2(x + self.dropout(attended))
        return self.norm3(x + self.dropout(self.feed_forward(x))), weights, m

    def forward(self, x: torch.Tensor, cross_kv: torch.Tensor, *,
                perturb: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x (N, T, dim), cross_kv (N, 2, heads, L, head_dim) -> (x, cross weights (N, heads, T, L), m or None)."""
        x = self.norm1(x + self.dropout(self.self_attention(x)))
        return self._cross_and_feed_forward(x, cross_kv, torch.arange(x.shape[1], device=x.device), perturb)

    def step(self, x: torch.Tensor, kv: torch.Tensor, cross_kv: torch.Tensor,
             position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, 1, dim) at ``position``; kv (N, 2, heads, Tmax, head_dim) -> (x, new kv, weights (N, heads, 1, L))."""
        attended, keys, values = self.self_attention.step(x, kv[:, 0], kv[:, 1], position)
        x = self.norm1(x + self.dropout(attended))
        x, weights, _ = self._cross_and_feed_forward(x, cross_kv, position.view(1), False)
        return x, torch.stack([keys, values], dim=1), weights


class TextDecoder(nn.Module):
    """Word embeddings + sinusoidal positions -> decoder layers -> log-probs over the vocabulary."""

    def __init__(self, config: A2Config):
        super().__init__()
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.register_buffer("positions", sinusoids(c.max_positions, c.d_model), persistent=False)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers))
        self.dropout = nn.Dropout(c.dropout)
        self.out = nn.Linear(c.d_model, c.vocab_size)
        self.scale = math.sqrt(c.d_model)

    def forward(self, tokens: torch.Tensor, cross_kv: torch.Tensor, *,
                perturb: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """tokens (B, T), cross_kv (B, layers, 2, heads, L, head_dim).

        Returns log-probs (B, T, V), the last layer's cross-attention averaged over heads (B, T, L), and every
        layer's mask m (B, heads, T, L) (empty without alignment).
        """
        x = self.dropout(self.embed(tokens) * self.scale + self.positions[: tokens.shape[1]])
        masks = []
        for i, layer in enumerate(self.layers):
            x, weights, m = layer(x, cross_kv[:, i], perturb=perturb)
            masks += [m] if m is not None else []
        return torch.log_softmax(self.out(x), dim=-1), weights.mean(dim=1), masks

    def step(self, tokens: torch.Tensor, kv: torch.Tensor, cross_kv: torch.Tensor,
             position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (N,), kv (N, layers, 2, heads, Tmax, head_dim) -> (log-probs (N, V), new kv, attention (N, L))."""
        x = self.embed(tokens).unsqueeze(1) * self.scale + self.positions.index_select(0, position.view(1))
        x = self.dropout(x)
        caches = []
        for i, layer in enumerate(self.layers):
            x, cache, weights = layer.step(x, kv[:, i], cross_kv[:, i], position)
            caches.append(cache)
        logprobs = torch.log_softmax(self.out(x[:, 0]), dim=-1)
        return logprobs, torch.stack(caches, dim=1), weights[:, :, 0].mean(dim=1)


class A2(nn.Module):
    def __init__(self, config: A2Config):
        super().__init__()
        self.config = c = config
        self.max_positions = c.max_positions  # static cache length: the exporter refuses longer captions
        self.project = nn.Sequential(nn.Linear(c.feature_dim, c.d_model), nn.ReLU(), nn.Dropout(c.dropout),
                                     nn.LayerNorm(c.d_model))
        self.locations = nn.Parameter(torch.randn(c.num_locations, c.d_model) * 0.02)  # the grid has no other order
        self.encoder_layers = nn.ModuleList(EncoderLayer(c.d_model, c.heads, c.ff_dim, c.dropout)
                                            for _ in range(c.layers))
        self.text_decoder = TextDecoder(c)

    def prepare(self, features: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Grid features (N, L, C) -> memory {cross_kv (N, layers, 2, heads, L, head_dim)}, state {kv, all zeros}."""
        x = self.project(features) + self.locations
        for layer in self.encoder_layers:
            x = layer(x)
        cross_kv = torch.stack([torch.stack(layer.cross_attention.attention.keys_values(x), dim=1)
                                for layer in self.text_decoder.layers], dim=1)
        c = self.config
        kv = x.new_zeros((x.shape[0], c.layers, 2, c.heads, c.max_positions, c.d_model // c.heads))
        return {spec.MEMORY_CROSS_KV: cross_kv}, {spec.STATE_KV: kv}

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor],
             position: torch.Tensor):
        """tokens (N,) at ``position`` (int64 scalar) -> (log-probs (N, V), new state, attention (N, L))."""
        if not torch.compiler.is_exporting() and int(position) >= self.max_positions:
            raise ValueError(f"A2 decoding step {int(position)} is past its KV cache of max_positions="
                             f"{self.max_positions}; decode shorter captions or train with a larger max_positions")
        logprobs, kv, attention = self.text_decoder.step(tokens, state[spec.STATE_KV], memory[spec.MEMORY_CROSS_KV],
                                                         position)
        return logprobs, {spec.STATE_KV: kv}, attention

    def teacher_forced(self, tokens: torch.Tensor,
                       memory: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position of tokens (N, T) at once, given ``prepare``'s memory of each row -> (log-probs (N, T, V),
        attention (N, T, L)): what ``step`` computes position by position, without a cache."""
        logprobs, attention, _ = self.text_decoder(tokens, memory[spec.MEMORY_CROSS_KV])
        return logprobs, attention

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, *,
                rows: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: features (B, L, C), tokens (B, T) starting with bos.

        ``rows`` (B,) is each caption's photo when features hold one row per photo (``per_caption``).

        Returns ``logprobs`` (B, T, V) and ``attention`` (B, T, L) (the last layer's α^a, mean over heads); in
        training mode with alignment also ``auxiliary_loss``, the mask network's weighted objective.
        """
        if tokens.shape[1] > self.max_positions:
            raise ValueError(f"A2 got {tokens.shape[1]} positions but max_positions is {self.max_positions}")
        memory = per_caption(self.prepare(features)[0], rows)
        cross_kv = memory[spec.MEMORY_CROSS_KV]
        logprobs, attention = self.teacher_forced(tokens, memory)
        aligned = self.training and self.config.alignment != "none"
        return DecoderOutput(logprobs, attention,
                             auxiliary_loss=self.mask_objective(tokens, cross_kv) if aligned else None)

    def mask_objective(self, tokens: torch.Tensor, cross_kv: torch.Tensor) -> torch.Tensor:
        """−L_IC(α^p) + λ‖1 − m‖², differentiable in the mask networks' parameters only (module docstring)."""
        masks = {id(p) for layer in self.text_decoder.layers for p in layer.cross_attention.mask.parameters()}
        frozen = {name: p.detach() for name, p in self.text_decoder.named_parameters() if id(p) not in masks}
        logprobs, _, m = torch.func.functional_call(self.text_decoder, frozen, (tokens, cross_kv.detach()),
                                                    {"perturb": True})
        target, seen = tokens[:, 1:], (tokens != PAD).float()
        counted = (target != PAD).float()
        nll = -logprobs[:, :-1].gather(-1, target.unsqueeze(-1)).squeeze(-1)
        captioning = (nll * counted).sum() / counted.sum().clamp(min=1)
        # ‖1 − m‖² over regions, averaged over rows, heads and real (non-pad) positions, summed over layers.
        per_position = sum(((1 - mask) ** 2).sum(dim=-1).mean(dim=1) for mask in m)  # (B, T)
        regulariser = (per_position * seen).sum() / seen.sum().clamp(min=1)
        return -captioning + self.config.mask_lambda * regulariser
