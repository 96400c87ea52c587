"""Show, Attend and Tell (Xu et al. 2015): LSTM decoder with soft or hard attention.

Modules only. The step contract (docs/design.md): ``prepare`` turns grid features
into the per-image memory and the initial state once; ``step`` advances every row
by one word; ``forward`` is the teacher-forced equivalent used for training.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from edgecap import spec
from edgecap.models.output import DecoderOutput, per_caption


@dataclass(frozen=True)
class SATConfig:
    vocab_size: int  # words including the four specials
    feature_dim: int = 1280  # channels C of the encoder grid
    annotation_dim: int = 512  # D of the annotation vectors a_i = ReLU(W_f f_i) (0: use the grid as is)
    num_locations: int = 49  # grid cells L
    embed_dim: int = 512  # word embedding E y
    hidden_dim: int = 512  # LSTM h and c
    att_dim: int = 512  # hidden size of the f_att MLP
    dropout: float = 0.5  # on h_t before the deep output layer
    gate: bool = True  # the paper's gating scalar beta_t = sigmoid(f_beta(h_{t-1}))
    attention: str = "soft"  # "soft" (deterministic) or "hard" (REINFORCE-trained; inference is soft)


class SoftAttention(nn.Module):
    """f_att: e_ti = w^T tanh(W_a a_i + W_h h_{t-1}); alpha = softmax(e)."""

    def __init__(self, feature_dim: int, hidden_dim: int, att_dim: int):
        super().__init__()
        self.feature_proj = nn.Linear(feature_dim, att_dim)
        self.hidden_proj = nn.Linear(hidden_dim, att_dim)
        self.score = nn.Linear(att_dim, 1)

    def forward(self, att_proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """att_proj (N, L, A) = W_a a precomputed once per image; h (N, H) -> alpha (N, L)."""
        e = self.score(torch.tanh(att_proj + self.hidden_proj(h).unsqueeze(1))).squeeze(-1)
        return torch.softmax(e, dim=-1)


class SAT(nn.Module):
    def __init__(self, config: SATConfig):
        super().__init__()
        self.config = c = config
        d = c.annotation_dim or c.feature_dim
        self.annotate = nn.Linear(c.feature_dim, d) if c.annotation_dim else None
        self.embed = nn.Embedding(c.vocab_size, c.embed_dim)
        self.init_h = nn.Linear(d, c.hidden_dim)
        self.init_c = nn.Linear(d, c.hidden_dim)
        self.attention = SoftAttention(d, c.hidden_dim, c.att_dim)
        self.f_beta = nn.Linear(c.hidden_dim, 1) if c.gate else None
        self.lstm = nn.LSTMCell(c.embed_dim + d, c.hidden_dim)
        self.dropout = nn.Dropout(c.dropout)
        self.out_h = nn.Linear(c.hidden_dim, c.embed_dim)  # L_h
        self.out_z = nn.Linear(d, c.embed_dim)  # L_z
        self.out = nn.Linear(c.embed_dim, c.vocab_size)  # L_o

    def prepare(self, features: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Grid features (N, L, C) -> (memory, initial state), named as in ``edgecap.spec``."""
        if self.annotate is not None:
            features = torch.relu(self.annotate(features))
        mean = features.mean(dim=1)
        memory = {spec.MEMORY_FEATURES: features, spec.MEMORY_ATT_PROJ: self.attention.feature_proj(features)}
        state = {spec.STATE_H: torch.tanh(self.init_h(mean)), spec.STATE_C: torch.tanh(self.init_c(mean))}
        return memory, state

    @staticmethod
    def _expected_context(features: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return torch.bmm(alpha.unsqueeze(1), features).squeeze(1)

    def _gate(self, z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return z * torch.sigmoid(self.f_beta(h)) if self.f_beta is not None else z

    def _advance(self, y: torch.Tensor, z: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """One LSTM step and the deep output layer -> (logits (N, V), h, c)."""
        h, c = self.lstm(torch.cat([y, z], dim=-1), (h, c))
        logits = self.out(y + self.out_h(self.dropout(h)) + self.out_z(z))
        return logits, h, c

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor],
             position: torch.Tensor):
        """tokens (N,) -> (log-probs (N, V), new state, attention (N, L)); soft attention (expected context).

        ``position`` (int64 scalar) is unused: the LSTM state already carries it.
        """
        h, c = state[spec.STATE_H], state[spec.STATE_C]
        features = memory[spec.MEMORY_FEATURES]
        alpha = self.attention(memory[spec.MEMORY_ATT_PROJ], h)
        z = self._gate(self._expected_context(features, alpha), h)
        logits, h, c = self._advance(self.embed(tokens), z, h, c)
        return torch.log_softmax(logits, dim=-1), {spec.STATE_H: h, spec.STATE_C: c}, alpha

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, *, rows: torch.Tensor | None = None,
                hard: bool = False, expected: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: features (B, L, D), tokens (B, T) starting with bos.

        ``rows`` (B,) is each caption's photo when features hold one row per photo (``per_caption``).

        Returns ``logprobs`` (B, T, V) and ``attention`` α (B, T, L); with ``hard`` the
        context is one sampled location a_s, and ``location_logprob`` (B, T) and
        ``entropy`` (B, T) feed the REINFORCE update of the paper's hard attention.
        ``expected`` (B,) bool marks rows that take the expected context instead, as
        the paper does for half its images (§4.1): they train as soft attention, so
        their ``location_logprob`` and ``entropy`` are 0.
        """
        memory, state = self.prepare(features)
        memory, state = per_caption(memory, rows), per_caption(state, rows)
        h, c = state[spec.STATE_H], state[spec.STATE_C]
        features, att_proj = memory[spec.MEMORY_FEATURES], memory[spec.MEMORY_ATT_PROJ]
        embedded = self.embed(tokens)
        logprobs, alphas, location_logprobs, entropies = [], [], [], []
        for t in range(tokens.shape[1]):
            alpha = self.attention(att_proj, h)
            if hard:
                dist = torch.distributions.Categorical(probs=alpha)
                location = dist.sample()
                location_logprob, entropy = dist.log_prob(location), dist.entropy()
                z = features[torch.arange(features.shape[0]), location]
                if expected is not None:
                    z = torch.where(expected.unsqueeze(1), self._expected_context(features, alpha), z)
                    location_logprob = location_logprob.masked_fill(expected, 0)
                    entropy = entropy.masked_fill(expected, 0)
                location_logprobs.append(location_logprob)
                entropies.append(entropy)
            else:
                z = self._expected_context(features, alpha)
            z = self._gate(z, h)
            logits, h, c = self._advance(embedded[:, t], z, h, c)
            logprobs.append(torch.log_softmax(logits, dim=-1))
            alphas.append(alpha)
        out = DecoderOutput(torch.stack(logprobs, 1), torch.stack(alphas, 1), doubly_stochastic=True)
        if not hard:
            return out
        return replace(out, location_logprob=torch.stack(location_logprobs, 1), entropy=torch.stack(entropies, 1))
