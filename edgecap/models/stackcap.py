"""Stack-Captioning (Gu et al. 2018): one coarse LSTM and N_f fine attention LSTMs, refined within every time step.

Modules only. At time t the coarse LSTM reads the previous word, the mean annotation
vector and the last fine stage's previous hidden state; fine stage i then attends over
the annotation vectors with the hidden state of stage i-1 (stacked attention) and
refines it. Every stage has its own output layer: training supervises all of them,
inference reads the last. Same step contract as SAT (``prepare`` / ``step`` /
teacher-forced ``forward``), with ``stage_step`` exposing every stage for the
coarse-to-fine reinforcement learning of ``edgecap.training.c2f``. With no fine stage
(``fine_stages=0``) the model is the paper's coarse baseline: an LSTM that reads the mean
annotation vector, which is attention spread evenly over the cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.models.output import DecoderOutput, per_caption
from edgecap.models.sat import SoftAttention

MEMORY_MEAN = "memory.mean_feature"  # float32 [N, D]: f(V), the mean annotation vector the coarse stage reads
COARSE = "coarse"  # stage name of the coarse LSTM; fine stages are "fine1" ... "fineN"

HC = list[tuple[torch.Tensor, torch.Tensor]]  # (h, c) per stage, coarse first


def stage_names(fine_stages: int) -> list[str]:
    """``["coarse", "fine1", ..., "fine{N_f}"]``: the suffixes of the state names, in decoding order."""
    return [COARSE, *(f"fine{i}" for i in range(1, fine_stages + 1))]


def att_proj_name(stage: str) -> str:
    """Memory name of a fine stage's W_a V: ``memory.att_proj.fine1``."""
    return f"{spec.MEMORY_ATT_PROJ}.{stage}"


def state_names(stage: str) -> tuple[str, str]:
    """(h, c) state names of one stage; cell states start with ``state.c`` so fp16 graphs keep them fp32."""
    return f"{spec.STATE_H}.{stage}", f"{spec.STATE_C}.{stage}"


@dataclass(frozen=True)
class StackCapConfig:
    vocab_size: int  # words including the four specials
    feature_dim: int = 1280  # channels C of the encoder grid
    num_locations: int = 49  # grid cells L
    annotation_dim: int = 512  # D of the annotation vectors V_n = ReLU(W_f f_n) (0: use the grid as is)
    embed_dim: int = 512  # word embedding
    hidden_dim: int = 512  # h and c of every stage's LSTM
    att_dim: int = 512  # hidden size of each fine stage's attention MLP
    dropout: float = 0.5  # on every stage's h_t before its output layer
    fine_stages: int = 2  # N_f fine attention LSTMs after the coarse one (0: the coarse stage alone)

    def __post_init__(self):
        if self.fine_stages < 0:
            raise ModelError(f"stackcap needs fine_stages >= 0, got {self.fine_stages}")


class StackCap(nn.Module):
    def __init__(self, config: StackCapConfig):
        super().__init__()
        self.config = c = config
        d = c.annotation_dim or c.feature_dim
        self.stages = stage_names(c.fine_stages)
        self.annotate = nn.Linear(c.feature_dim, d) if c.annotation_dim else None
        self.embed = nn.Embedding(c.vocab_size, c.embed_dim)
        self.coarse = nn.LSTMCell(c.embed_dim + d + c.hidden_dim, c.hidden_dim)
        self.attention = nn.ModuleList(SoftAttention(d, c.hidden_dim, c.att_dim) for _ in range(c.fine_stages))
        # W, b of the stacked query h~^{i-1} = h^{i-1} + sum_n alpha^{i-1,n} (W V_n + b), for fine stages 2..N_f.
        self.stack = nn.ModuleList(nn.Linear(d, c.hidden_dim) for _ in range(c.fine_stages - 1))
        self.fine = nn.ModuleList(nn.LSTMCell(c.hidden_dim + d, c.hidden_dim) for _ in range(c.fine_stages))
        self.dropout = nn.Dropout(c.dropout)
        self.out = nn.ModuleList(nn.Linear(c.hidden_dim, c.vocab_size) for _ in self.stages)

    def prepare(self, features: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Grid features (N, L, C) -> (memory, zero initial state of every stage), named as in ``edgecap.spec``."""
        if self.annotate is not None:
            features = torch.relu(self.annotate(features))
        memory = {spec.MEMORY_FEATURES: features, MEMORY_MEAN: features.mean(dim=1)}
        for stage, attention in zip(self.stages[1:], self.attention, strict=True):
            memory[att_proj_name(stage)] = attention.feature_proj(features)
        rows = features.shape[0]
        state = {name: features.new_zeros(rows, self.config.hidden_dim)
                 for stage in self.stages for name in state_names(stage)}
        return memory, state

    def _unpack(self, state: dict[str, torch.Tensor]) -> HC:
        return [tuple(state[name] for name in state_names(stage)) for stage in self.stages]

    def _pack(self, hc: HC) -> dict[str, torch.Tensor]:
        return {name: t for stage, pair in zip(self.stages, hc, strict=True)
                for name, t in zip(state_names(stage), pair, strict=True)}

    def _advance(self, y: torch.Tensor, hc: HC, memory: dict[str, torch.Tensor], *,
                 every_stage: bool) -> tuple[list[torch.Tensor], HC, torch.Tensor]:
        """One time step of the coarse-to-fine chain for embedded words y (N, E).

        Returns the logits (N, V) of every stage (coarse first) or, for inference, of the
        last one only; the new (h, c) of every stage; the last fine stage's attention (N, L),
        uniform when there is none (the coarse stage reads the cells' mean).
        """
        features = memory[spec.MEMORY_FEATURES]
        h, c = self.coarse(torch.cat([y, memory[MEMORY_MEAN], hc[-1][0]], dim=-1), hc[0])
        new = [(h, c)]
        query, context = h, None
        for i, stage in enumerate(self.stages[1:]):
            if context is not None:  # sum_n alpha_n (W V_n + b) = W (sum_n alpha_n V_n) + b as the alphas sum to 1
                query = h + self.stack[i - 1](context)
            alpha = self.attention[i](memory[att_proj_name(stage)], query)
            context = torch.bmm(alpha.unsqueeze(1), features).squeeze(1)
            h, c = self.fine[i](torch.cat([query, context], dim=-1), hc[i + 1])
            new.append((h, c))
        if not self.attention:  # the coarse stage alone: the mean it reads is attention spread evenly
            alpha = torch.full_like(features[..., 0], 1.0 / features.shape[1])
        heads = range(len(new)) if every_stage else [len(new) - 1]
        return [self.out[k](self.dropout(new[k][0])) for k in heads], new, alpha

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor],
             position: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """tokens (N,) -> (last stage's log-probs (N, V), new state, last stage's attention (N, L)).

        ``position`` (int64 scalar) is unused: the LSTM states already carry it.
        """
        logits, hc, alpha = self._advance(self.embed(tokens), self._unpack(state), memory, every_stage=False)
        return torch.log_softmax(logits[-1], dim=-1), self._pack(hc), alpha

    def stage_step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor], memory: dict[str, torch.Tensor],
                   position: torch.Tensor) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
        """``step`` with the log-probs (N, V) of every stage, coarse first: coarse-to-fine RL samples from each."""
        logits, hc, alpha = self._advance(self.embed(tokens), self._unpack(state), memory, every_stage=True)
        return [torch.log_softmax(x, dim=-1) for x in logits], self._pack(hc), alpha

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, *,
                rows: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: features (B, L, C), tokens (B, T) starting with bos.

        ``rows`` (B,) is each caption's photo when features hold one row per photo (``per_caption``).

        Returns ``logprobs`` (B, T, V) of the last stage, ``stage_logprobs`` (the
        earlier stages' (B, T, V), coarse first; the trainer adds their XE) and the
        last stage's soft attention (B, T, L).
        """
        memory, state = self.prepare(features)
        memory, state = per_caption(memory, rows), per_caption(state, rows)
        hc = self._unpack(state)
        embedded = self.embed(tokens)
        logits, alphas = [[] for _ in self.stages], []
        for t in range(tokens.shape[1]):
            step_logits, hc, alpha = self._advance(embedded[:, t], hc, memory, every_stage=True)
            for collected, x in zip(logits, step_logits, strict=True):
                collected.append(x)
            alphas.append(alpha)
        stages = [torch.log_softmax(torch.stack(x, 1), dim=-1) for x in logits]
        return DecoderOutput(stages[-1], torch.stack(alphas, 1), doubly_stochastic=bool(self.attention),
                             stage_logprobs=tuple(stages[:-1]))
