"""Transformer building blocks shared by the A² and GLIED captioners, with an explicit static KV cache.

The cache is a plain tensor the caller carries as step state: ``write_at`` puts
one position's keys/values into a preallocated (N, heads, Tmax, d_head) buffer
with a Where-mask (exports cleanly with torch 2.13's default exporter, where
``cache[:, :, step] = k`` does not), and ``visible_upto`` hides the later,
still-empty positions. Cross-attention keys/values of the image are projected
once (``MultiHeadAttention.keys_values``) and passed back in as tensors, never
cached inside a module.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def write_at(cache: torch.Tensor, new: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """cache (N, H, Tmax, d) with slot ``position`` replaced by new (N, H, 1, d); position an int64 scalar."""
    slot = torch.arange(cache.shape[2], device=cache.device) == position
    return torch.where(slot.view(1, 1, -1, 1), new, cache)


def visible_upto(length: int, position: torch.Tensor) -> torch.Tensor:
    """bool (1, 1, 1, length): the cache slots a query at ``position`` may attend to (itself and earlier)."""
    return (torch.arange(length, device=position.device) <= position).view(1, 1, 1, -1)


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """bool (1, 1, T, T): query t sees keys 0..t (teacher forcing's equivalent of ``visible_upto``)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril().view(1, 1, length, length)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``heads``; also returns the per-head weights (A² perturbs them)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"model dim {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim = heads, dim // heads
        self.query, self.key, self.value, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.dropout = nn.Dropout(dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, dim) -> (N, heads, T, head_dim)."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """(N, heads, T, head_dim) -> (N, T, dim)."""
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.heads * self.head_dim)

    def keys_values(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """source (N, S, dim) -> keys, values (N, heads, S, head_dim): computed once per image for cross-attention."""
        return self.split(self.key(source)), self.split(self.value(source))

    def weights(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (N, T, dim) -> softmax weights (N, heads, T, S); ``mask`` is True where a key is visible."""
        scores = self.split(self.query(query)) @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)

    def combine(self, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """weights (N, heads, T, S), values (N, heads, S, head_dim) -> output (N, T, dim)."""
        return self.out(self.merge(self.dropout(weights) @ values))

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (output (N, T, dim), weights (N, heads, T, S))."""
        weights = self.weights(query, keys, mask)
        return self.combine(weights, values), weights


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class EncoderLayer(nn.Module):
    """Post-norm self-attention + feed-forward over image regions (runs once per image, in the encoder graph)."""

    def __init__(self, dim: int, heads: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.attention = MultiHeadAttention(dim, heads, dropout)
        self.feed_forward = FeedForward(dim, hidden, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, S, dim) -> (N, S, dim)."""
        attended, _ = self.attention(x, *self.attention.keys_values(x))
        x = self.norm1(x + self.dropout(attended))
        return self.norm2(x + self.dropout(self.feed_forward(x)))


class CachedSelfAttention(nn.Module):
    """Masked self-attention over the words so far: full sequence for teacher forcing, one position with a cache.

    Both paths compute the same function, which the models' step == forward tests rely on.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.attention = MultiHeadAttention(dim, heads, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: x (N, T, dim) -> (N, T, dim), causal."""
        out, _ = self.attention(x, *self.attention.keys_values(x), causal_mask(x.shape[1], x.device))
        return out

    def step(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
             position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, 1, dim) at ``position``; keys/values caches (N, heads, Tmax, head_dim) -> (out, keys, values)."""
        new_keys, new_values = self.attention.keys_values(x)
        keys, values = write_at(keys, new_keys, position), write_at(values, new_values, position)
        out, _ = self.attention(x, keys, values, visible_upto(keys.shape[2], position))
        return out, keys, values


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """(length, dim) sinusoidal position table (Vaswani et al.), fixed so any position up to ``length`` is exact."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    rate = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
    return table
