"""GLIED (Liu et al. 2019, Global-and-Local Information Exploring-and-Distilling) with a MIL attribute head.

Modules only, from building blocks to the model. Notation: f_i the C-dim grid features (i = 1..L), x_t the
input word's embedding plus its sinusoidal position, E the word embedding table, LN a LayerNorm, H(q, K, V)
multi-head attention, and G the gated fusion

    G(a, b) = g * a + (1 - g) * b,    g = sigmoid(W_g [a; b] + b_g)

which lets through as much of the attended information a as the pivot b asks for.

Encoder graph (``prepare``, once per image):

    attributes   s_iw = MLP(f_i)_w over the attribute vocabulary w (ids 4 .. 4+W-1: the W most frequent
                 words, since ``Vocab`` is frequency ordered), noisy-OR over cells (Fang et al. 2015):
                 P(w | I) = 1 - prod_i (1 - sigmoid(s_iw)) = 1 - exp(-e_w),   e_w = sum_i softplus(s_iw)
                 A = E[top-K_w e_w]      (ranked by the evidence e_w, which unlike P never saturates at 1)
    regions      I = LN(W_f f_i + p_i),  p_i a learned position per cell
    global visual distilling   I~ = EncoderLayer^N(I)          (self-attention over regions)
    global aspect vector       a_n = W_n mean_i I~_i           (one per decoder layer n)

and the cross-attention keys/values of I~ and of A for every decoder layer. Stop words are not skipped: the
model sees vocabulary ids only (no word strings without changing how the trainer builds it), Fang et al. and
You et al. keep them in their top-1000 lists, and relational words (``two``, ``on``, ``in``) carry image
content; the cost is a few of the K slots on images where function words are near-certain.

Decoder layer n (post-norm; h^0_t = dropout(x_t); the word self-attention's keys/values are the cache):

    global attribute distilling   t~ = LN(G(H_a(h_t, A, A), h_t))              (the input word is the pivot)
    caption context + aspect      c~_g = LN(t~ + H_w(t~_t, t~_<=t, t~_<=t) + a_n)
    local cross-modal distilling  c_l = LN(G(H_v(c~_g, I~, I~) + H_a(c~_g, A, A), c~_g))
    feed-forward                  h^n_t = LN(c_l + FFN(c_l))

H_a is one module per layer, shared by the global attribute and the local cross-modal distilling (the
paper's "shared parameters"), so A's keys/values are one memory tensor. Output p(y_t) = softmax(W_o h^N_t).

The cross-modal base model (paper Fig. 2 left, ``variant="base"``) keeps the attribute head, the region
self-attention and the shared attention modules but drops the distilling: t~ = h_t, no aspect vector, and
c_l = LN(c~ + H_v(c~, I~, I~) + H_a(c~, A, A)) with c~ = LN(t~ + H_w(t~)).

Training: the attribute ids are the head's own top-K (discrete; the captioner's gradient does not reach the
head), and ``forward`` returns ``auxiliary_loss`` = ``mil_weight`` x the mean binary cross-entropy between
P(w | I) and whether word w occurs in the caption being taught; over an epoch each image is seen with all its
captions, so the head learns P(w in a caption of I).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.models.attention import CachedSelfAttention, EncoderLayer, FeedForward, MultiHeadAttention, sinusoids
from edgecap.models.output import DecoderOutput, per_caption
from edgecap.vocab import SPECIALS

VARIANTS = ("glied", "base")
FIRST_ATTRIBUTE = len(SPECIALS)  # id of the most frequent word: the attribute vocabulary starts there
ATTRIBUTE_PRIOR = 0.05  # initial P(w | I) of every attribute word, so training starts from sparse predictions


@dataclass(frozen=True)
class GLIEDConfig:
    vocab_size: int  # words including the four specials
    feature_dim: int = 1280  # channels C of the encoder grid
    num_locations: int = 49  # grid cells L
    d_model: int = 512  # width D of regions, words and attributes (attribute embeddings are the word embeddings)
    heads: int = 8  # attention heads
    layers: int = 3  # region self-attention layers and decoder layers (N of each)
    ff_dim: int = 2048  # feed-forward hidden size
    dropout: float = 0.1  # on embeddings, attention weights and sublayer outputs
    max_positions: int = 32  # static KV cache length Tmax: positions 0..Tmax-1, so at most Tmax-1 words + eos
    attributes_vocab: int = 1000  # W: the MIL head scores the W most frequent words (fewer if the vocab is smaller)
    attributes: int = 10  # K: top attribute words the decoder attends to
    mil_weight: float = 1.0  # weight of the MIL head's binary cross-entropy added to the caption loss
    variant: str = "glied"  # "glied" (distilling) or "base" (the paper's cross-modal base model, for ablation)

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ModelError(f"glied variant '{self.variant}' is not one of {', '.join(VARIANTS)}")
        if self.d_model % self.heads:
            raise ModelError(f"glied d_model {self.d_model} is not divisible by heads {self.heads}")
        if not 1 <= self.attributes <= self.attribute_words:
            raise ModelError(f"glied attributes (top-K) {self.attributes} must be between 1 and the attribute "
                             f"vocabulary min(attributes_vocab {self.attributes_vocab}, vocab_size "
                             f"{self.vocab_size} - {FIRST_ATTRIBUTE}) = {self.attribute_words}")

    @property
    def attribute_words(self) -> int:
        """W actually scored: ``attributes_vocab`` capped by the words the vocabulary has."""
        return min(self.attributes_vocab, self.vocab_size - FIRST_ATTRIBUTE)


class Gate(nn.Module):
    """G(a, b) = g * a + (1 - g) * b with g = sigmoid(W_g [a; b] + b_g), elementwise over D."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(2 * dim, dim)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a, b (..., D) -> (..., D)."""
        g = torch.sigmoid(self.proj(torch.cat([a, b], dim=-1)))
        return g * a + (1 - g) * b


class AttributeHead(nn.Module):
    """Multiple-instance learning over grid cells: per-cell word logits, noisy-OR pooled to the image."""

    def __init__(self, feature_dim: int, hidden: int, words: int, locations: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(feature_dim, hidden), nn.ReLU(), nn.Linear(hidden, words))
        # sigmoid(bias) per cell such that 1 - (1 - p)^L = ATTRIBUTE_PRIOR: every word starts unlikely.
        nn.init.constant_(self.net[-1].bias, math.log(math.expm1(-math.log1p(-ATTRIBUTE_PRIOR) / locations)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (N, L, C) -> evidence e (N, W) = -log(1 - P(w | I)) = sum_i softplus(s_iw), >= 0."""
        return F.softplus(self.net(features)).sum(dim=1)

    @staticmethod
    def loss(evidence: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Mean binary cross-entropy of P = 1 - exp(-e) against ``present`` (N, W) in {0, 1}."""
        log_p = torch.log(-torch.expm1(-evidence.clamp(min=1e-6)))  # log P, finite where e underflows to 0
        return -(present * log_p - (1 - present) * evidence).mean()


class DecoderLayer(nn.Module):
    """One GLIED (or base) decoder layer; teacher-forced over T positions, or one position with its KV cache."""

    def __init__(self, dim: int, heads: int, hidden: int, dropout: float, *, distil: bool):
        super().__init__()
        self.attributes = MultiHeadAttention(dim, heads, dropout)  # H_a, shared by both distilling stages
        self.visual = MultiHeadAttention(dim, heads, dropout)  # H_v over the distilled regions
        self.words = CachedSelfAttention(dim, heads, dropout)  # H_w, the caption context
        self.feed_forward = FeedForward(dim, hidden, dropout)
        self.distil = distil
        if distil:
            self.attribute_gate, self.local_gate = Gate(dim), Gate(dim)
            self.aspect = nn.Linear(dim, dim)  # W_n: read by the model's prepare, once per image
            self.attribute_norm = nn.LayerNorm(dim)
        self.context_norm, self.local_norm, self.output_norm = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, attributes: torch.Tensor, regions: torch.Tensor, aspect: torch.Tensor | None,
                cache: torch.Tensor | None = None,
                position: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """h (N, T, D); attributes / regions keys and values (N, 2, heads, K or L, d_head); aspect (N, D) or None.

        Without ``cache`` the word self-attention is causal over the T positions (teacher forcing); with the
        cache (N, 2, heads, Tmax, d_head) T is 1 and the word is written at ``position``. Returns the layer
        output (N, T, D), the head-averaged attention over regions (N, T, L) and the updated cache (or None).
        """
        attribute_kv = attributes[:, 0], attributes[:, 1]
        if self.distil:
            t = self.attribute_norm(self.attribute_gate(self.dropout(self.attributes(h, *attribute_kv)[0]), h))
        else:
            t = h
        if cache is None:
            context = self.words(t)
        else:
            context, keys, values = self.words.step(t, cache[:, 0], cache[:, 1], position)
            cache = torch.stack([keys, values], dim=1)
        context = t + self.dropout(context)
        if self.distil:
            context = context + aspect.unsqueeze(1)
        c = self.context_norm(context)
        seen, weights = self.visual(c, regions[:, 0], regions[:, 1])
        cross = self.dropout(seen + self.attributes(c, *attribute_kv)[0])
        local = self.local_norm(self.local_gate(cross, c) if self.distil else c + cross)
        out = self.output_norm(local + self.dropout(self.feed_forward(local)))
        return out, weights.mean(dim=1), cache


class GLIED(nn.Module):
    def __init__(self, config: GLIEDConfig):
        super().__init__()
        self.config = c = config
        self.distil = c.variant == "glied"
        self.max_positions = c.max_positions  # static cache length: the exporter and runtime refuse longer captions
        self.embed = nn.Embedding(c.vocab_size, c.d_model)  # words, and attribute words (shared)
        self.project = nn.Linear(c.feature_dim, c.d_model)  # W_f
        self.region_positions = nn.Parameter(torch.zeros(c.num_locations, c.d_model))  # p_i
        self.region_norm = nn.LayerNorm(c.d_model)
        self.encoder = nn.ModuleList(EncoderLayer(c.d_model, c.heads, c.ff_dim, c.dropout) for _ in range(c.layers))
        self.attribute_head = AttributeHead(c.feature_dim, c.d_model, c.attribute_words, c.num_locations)
        self.decoder = nn.ModuleList(DecoderLayer(c.d_model, c.heads, c.ff_dim, c.dropout, distil=self.distil)
                                     for _ in range(c.layers))
        self.register_buffer("positions", sinusoids(c.max_positions, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.out = nn.Linear(c.d_model, c.vocab_size)  # W_o

    def _encode(self, features: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """features (N, L, C) -> (memory named as in ``edgecap.spec``, attribute evidence (N, W))."""
        regions = self.region_norm(self.project(features) + self.region_positions)
        for layer in self.encoder:
            regions = layer(regions)
        evidence = self.attribute_head(features)
        ids = evidence.topk(self.config.attributes, dim=-1).indices + FIRST_ATTRIBUTE
        attributes = self.embed(ids)
        memory = {
            spec.MEMORY_CROSS_KV: torch.stack([torch.stack(layer.visual.keys_values(regions), dim=1)
                                               for layer in self.decoder], dim=1),
            spec.MEMORY_ATTRIBUTE_KV: torch.stack([torch.stack(layer.attributes.keys_values(attributes), dim=1)
                                                   for layer in self.decoder], dim=1),
            spec.MEMORY_ATTRIBUTE_IDS: ids,
        }
        if self.distil:
            pooled = regions.mean(dim=1)
            memory[spec.MEMORY_ASPECT] = torch.stack([layer.aspect(pooled) for layer in self.decoder], dim=1)
        return memory, evidence

    def prepare(self, features: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Grid features (N, L, C) -> (memory, empty KV cache (N, layers, 2, heads, Tmax, d_head))."""
        c = self.config
        memory, _ = self._encode(features)
        cache = features.new_zeros(features.shape[0], c.layers, 2, c.heads, c.max_positions, c.d_model // c.heads)
        return memory, {spec.STATE_KV: cache}

    def _decode(self, h: torch.Tensor, memory: dict[str, torch.Tensor], cache: torch.Tensor | None,
                position: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """h (N, T, D) through every decoder layer -> (log-probs (N, T, V), attention (N, T, L), new cache)."""
        caches = []
        for n, layer in enumerate(self.decoder):
            aspect = memory[spec.MEMORY_ASPECT][:, n] if self.distil else None
            h, attention, layer_cache = layer(h, memory[spec.MEMORY_ATTRIBUTE_KV][:, n],
                                              memory[spec.MEMORY_CROSS_KV][:, n], aspect,
                                              None if cache is None else cache[:, n], position)
            caches.append(layer_cache)
        new_cache = None if cache is None else torch.stack(caches, dim=1)
        return torch.log_softmax(self.out(h), dim=-1), attention, new_cache

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor],
             position: torch.Tensor):
        """tokens (N,) at ``position`` (int64 scalar < max_positions) -> (log-probs (N, V), state, attention (N, L))."""
        if not torch.compiler.is_exporting() and int(position) >= self.max_positions:
            raise ModelError(f"glied decoding step {int(position)} is past its KV cache of max_positions "
                             f"{self.max_positions}; decode shorter captions or train with a larger max_positions")
        h = self.dropout(self.embed(tokens).unsqueeze(1) + self.positions.index_select(0, position.view(1)))
        logprobs, attention, cache = self._decode(h, memory, state[spec.STATE_KV], position)
        return logprobs[:, 0], {spec.STATE_KV: cache}, attention[:, 0]

    def teacher_forced(self, tokens: torch.Tensor,
                       memory: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position of tokens (N, T) at once, given ``prepare``'s memory of each row -> (log-probs (N, T, V),
        attention (N, T, L)): what ``step`` computes position by position, without a cache."""
        h = self.dropout(self.embed(tokens) + self.positions[: tokens.shape[1]])
        logprobs, attention, _ = self._decode(h, memory, None, None)
        return logprobs, attention

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, *,
                rows: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: features (B, L, C), tokens (B, T) starting with bos.

        ``rows`` (B,) is each caption's photo when features hold one row per photo (``per_caption``).

        Returns ``logprobs`` (B, T, V), ``attention`` (B, T, L) over regions (last layer, head mean) and
        ``auxiliary_loss``, the weighted MIL loss against the attribute words that occur in ``tokens``.
        """
        if tokens.shape[1] > self.config.max_positions:
            raise ModelError(f"glied: {tokens.shape[1]} positions exceed max_positions {self.config.max_positions}")
        memory, evidence = self._encode(features)
        memory, evidence = per_caption(memory, rows), evidence if rows is None else evidence.index_select(0, rows)
        logprobs, attention = self.teacher_forced(tokens, memory)
        words = evidence.new_zeros(tokens.shape[0], self.config.vocab_size).scatter_(1, tokens, 1.0)
        present = words[:, FIRST_ATTRIBUTE:FIRST_ATTRIBUTE + evidence.shape[1]]
        mil = self.config.mil_weight * AttributeHead.loss(evidence, present)
        return DecoderOutput(logprobs, attention, auxiliary_loss=mil)
