"""The training run: cross-entropy with teacher forcing, then self-critical CIDEr-D training.

A run directory holds the resolved ``config.json``, the command line, ``vocab.json``,
``metrics.jsonl``, ``best.pt`` (selected on dev CIDEr) and ``last.pt`` (everything
needed to resume). Checkpoints are written at the end of every epoch, atomically,
so a kill loses at most the epoch in progress.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgecap.checkpoint import checkpoint_payload, on_cpu, read_checkpoint, save_atomic
from edgecap.cider import CiderD
from edgecap.data import CaptionDataset, load_dataset
from edgecap.errors import ModelError
from edgecap.locks import writing
from edgecap.models import build_model
from edgecap.models.caption_model import CaptionModel
from edgecap.models.encoder import build_encoder, grid_features
from edgecap.preprocess import Preprocessing
from edgecap.runtime.search import SearchOptions
from edgecap.shipped import shipped_file_or
from edgecap.torch_backend import captions_of, search_features
from edgecap.training import distributed
from edgecap.training.c2f import self_critical_objective
from edgecap.training.data import (
    ImageFeatures,
    caption_pairs,
    epoch_order,
    mirrored_id,
    mirrored_token_table,
    tokenised_references,
)
from edgecap.training.ema import WeightAverage
from edgecap.training.hard_attention import hard_attention_loss
from edgecap.training.losses import word_nll, xe_loss
from edgecap.training.runs import RunSpec, last_phase, reopen, run_spec, write_run_files
from edgecap.training.state import TrainState
from edgecap.vocab import EOS, PAD, SPECIALS, Vocab
from edgecap.weight_storage import stored_weights


def lr_factor(step: int, *, warmup: int, total: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0.1 at ``total`` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


class Trainer:
    """Owns the model, optimiser and data of one run directory (on one rank of ``ctx`` when distributed)."""

    def __init__(self, run_dir: Path, spec: RunSpec, dataset: CaptionDataset, *, cache_dir: Path | None = None,
                 ctx: distributed.Context | None = None):
        self.run_dir, self.spec, self.cfg = run_dir, spec, spec.train
        self.dist = ctx or distributed.Context()
        torch.manual_seed(self.cfg.seed)
        self.train_records, self.dev_records = dataset.split("train"), dataset.split("dev")
        if self.cfg.select.images:
            self.dev_records = self.dev_records[: self.cfg.select.images]
        # A new run has no last.pt (train() refuses any other mix of --resume and run directory); files that a
        # new run killed before its first checkpoint left behind are rewritten, never read.
        resuming = (run_dir / "last.pt").exists()
        self.init = read_checkpoint(shipped_file_or(Path(self.cfg.init))) if self.cfg.init and not resuming else None
        self.vocab = self._vocabulary(resuming)
        self.prep = Preprocessing(image_size=spec.encoder.image_size)
        self.model = distributed.prepare_module(self._build_model(), self.dist)
        if not spec.encoder.finetune:
            self.model.encoder.requires_grad_(False)
        self.pairs = caption_pairs(self.train_records, self.vocab, max_length=self.cfg.max_caption_length)
        mirrored = self.cfg.xe.mirror_share > 0 or self.cfg.scst.mirror_share > 0
        self.train_features = ImageFeatures(self.train_records, self.model, spec.encoder, self.prep,
                                            cache_dir=cache_dir, label="train features", mirrored=mirrored)
        self.mirrored_tokens = mirrored_token_table(self.vocab)
        self.dev_features = ImageFeatures(self.dev_records, self.model, spec.encoder, self.prep,
                                          cache_dir=cache_dir, label="dev features")
        self.dev_cider = CiderD(tokenised_references(self.dev_records))
        self.train_cider: CiderD | None = None  # built when the self-critical phase starts
        self.state = TrainState()
        self.optimizer = self._optimizer(self.cfg.optim.lr)
        self.average = WeightAverage(self.model, self.cfg.optim.ema_decay) if self.cfg.optim.ema_decay else None

    def _vocabulary(self, resuming: bool) -> Vocab:
        """The run's own vocabulary when resuming, ``train.init``'s (its decoder's rows are its words), else new."""
        if resuming:
            return Vocab.from_json(json.loads((self.run_dir / "vocab.json").read_text()))
        if self.init:
            return Vocab.from_json(self.init["vocab"])
        return Vocab.build((c for r in self.train_records for c in r.captions), min_count=self.cfg.min_word_count)

    def _build_model(self) -> CaptionModel:
        """Encoder and decoder; the decoder's derived sizes come from the vocabulary and the encoder's grid."""
        encoder = build_encoder(self.spec.encoder)
        with torch.no_grad():
            probe = grid_features(encoder.eval(), torch.zeros(1, 3, self.prep.image_size, self.prep.image_size))
        config = {"vocab_size": len(self.vocab), "feature_dim": probe.shape[2], "num_locations": probe.shape[1],
                  **self.spec.model}
        return CaptionModel(encoder, build_model(self.spec.model_id, config))

    def start_from_init(self) -> None:
        """Load ``train.init``'s decoder (and its encoder when the encoder trains) into a new run's model."""
        if self.init is None:
            return
        source, payload = self.cfg.init, self.init
        decoder_config = asdict(self.model.decoder.config)
        if payload["model_id"] != self.spec.model_id or payload["model_config"] != decoder_config:
            differ = sorted(k for k in decoder_config if payload["model_config"].get(k) != decoder_config[k])
            raise ModelError(f"{source}: train.init holds a {payload['model_id']} decoder that differs from this "
                             f"run's {self.spec.model_id} in {', '.join(differ) or 'its model'}; pass a checkpoint "
                             "of the same model, encoder and --set model.* options")
        self.model.decoder.load_state_dict(stored_weights(payload["decoder"]))
        if self.spec.encoder.finetune and payload["encoder"] is not None:
            try:
                self.model.encoder.load_state_dict(stored_weights(payload["encoder"]))
            except RuntimeError:
                raise ModelError(f"{source}: train.init's encoder does not fit this run's {self.spec.encoder.name}; "
                                 "set encoder.name and encoder.image_size to the checkpoint's") from None
        if self.average:
            self.average.reset()
        self.init = None

    def describe(self) -> str:
        """One line for the start of a run: what trains, where, on how much data (so a GPU user sees it is used)."""
        device = self.dist.device
        where = f"{device.type} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type
        if self.dist.world_size > 1:
            where += f" x {self.dist.world_size} processes"
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        return (f"{self.run_dir}: {self.spec.model_id}, {trainable / 1e6:.1f} M trainable parameters on {where}; "
                f"{len(self.train_records)} training photos ({len(self.pairs.tokens)} captions), "
                f"{len(self.dev_records)} dev photos")

    def _optimizer(self, lr: float) -> torch.optim.Optimizer:
        """AdamW over the decoder and, when it trains, the encoder at ``encoder_lr / lr`` of the rate (its scale)."""
        optim = self.cfg.optim
        groups = [{"params": list(self.model.decoder.parameters()), "scale": 1.0}]
        encoder = [p for p in self.model.encoder.parameters() if p.requires_grad]
        if encoder:
            groups.append({"params": encoder, "scale": optim.encoder_lr / optim.lr if optim.encoder_lr else 1.0})
        for group in groups:
            group["lr"] = lr * group["scale"]
        return torch.optim.AdamW(groups, lr=lr, weight_decay=optim.weight_decay)

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("scale", 1.0)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _payload(self, metrics: dict) -> dict:
        return checkpoint_payload(self.model, model_id=self.spec.model_id, vocab=self.vocab, prep=self.prep,
                                  encoder_config=self.spec.encoder, metrics=metrics)

    def save_last(self, metrics: dict) -> None:
        if not self.dist.is_main:
            return
        payload = self._payload(metrics)
        payload["train_state"] = {**self.state.to_json(), "optimizer": on_cpu(self.optimizer.state_dict())}
        if self.average:
            payload["train_state"]["weight_average"] = self.average.state_dict()
        save_atomic(payload, self.run_dir / "last.pt")

    def resume(self) -> None:
        payload = read_checkpoint(self.run_dir / "last.pt")
        self._load_weights(payload)
        saved = dict(payload["train_state"])
        optimizer, average = saved.pop("optimizer"), saved.pop("weight_average", None)
        self.state = TrainState(**saved)
        if self.state.phase == "done":
            message = reopen(self.state, self.cfg, last_phase(self.run_dir))
            if self.dist.is_main:
                tqdm.write(f"{self.run_dir}: {message}")
        if self.state.phase == "scst":
            self.optimizer = self._optimizer(self.cfg.scst.lr)
        self.optimizer.load_state_dict(optimizer)
        if self.average and average:
            self.average.load_state_dict(average)
        if self.state.phase == "scst":  # the self-critical rate is constant: take it from config.json
            self._set_lr(self.cfg.scst.lr)

    def _load_weights(self, payload: dict) -> None:
        self.model.decoder.load_state_dict(payload["decoder"])
        if payload["encoder"] is not None:
            self.model.encoder.load_state_dict(payload["encoder"])

    def _log(self, record: dict) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- evaluation --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        """Dev CIDEr-D (0-100 scale) of beam search through the runtime's search, the number selection uses."""
        self.model.eval()
        options = SearchOptions(beam_size=self.cfg.select.beam, max_length=self.cfg.max_caption_length)
        features = self.dev_features.get(np.arange(len(self.dev_records)))
        captions = captions_of(search_features(self.model.decoder, features, self.vocab, options), self.vocab)
        ids = [r.image_id for r in self.dev_records]
        return 100.0 * float(self.dev_cider.score(ids, [c.split() for c in captions]).mean())

    # -- one step and one epoch of each phase ------------------------------------------------------------------
    def _update(self, loss: torch.Tensor) -> None:
        """One optimiser step on ``loss``: gradients summed over ranks (a no-op alone), clipped, then applied."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(self.model, self.dist)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        if self.average:
            self.average.update()
        self.state.step += 1

    def _train_mode(self) -> None:
        """Train mode, except what stays fixed: a frozen encoder, or a fine-tuned one's BatchNorm statistics."""
        self.model.train()
        if not self.spec.encoder.finetune:
            self.model.encoder.eval()
        elif self.spec.encoder.frozen_batchnorm:
            for module in self.model.encoder.modules():
                if isinstance(module, (torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm)):
                    module.eval()

    def _xe_loss(self, rows: np.ndarray, flipped: np.ndarray, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, plain cross-entropy) of this rank's ``rows`` of a global batch of ``n_rows`` caption pairs."""
        cfg = self.cfg
        tokens = torch.from_numpy(self.pairs.batch(rows, flipped, self.mirrored_tokens))
        tokens = tokens[:, :int((tokens != PAD).sum(1).max())].to(self.dist.device)
        features, photo = self.train_features.shared(self.pairs.image_index[rows], flipped)
        hard = self.spec.model.get("attention") == "hard"
        if hard:
            expected = torch.rand(len(rows), device=self.dist.device) < cfg.hard.expected_share
            out = self.model.decoder(features, tokens[:, :-1], rows=photo, hard=True, expected=expected)
        else:
            out = self.model.decoder(features, tokens[:, :-1], rows=photo)
        target = tokens[:, 1:]
        mask = (target != PAD).float()
        n_tokens = distributed.global_sum(mask.sum())
        loss, xe = xe_loss(out, target, mask, cfg.xe, n_tokens=n_tokens, n_rows=n_rows)
        if hard:
            reinforce, self.state.hard_baseline = hard_attention_loss(
                out, word_nll(out.logprobs, target), mask, ~expected, baseline=self.state.hard_baseline,
                cfg=cfg.hard, n_tokens=n_tokens)
            loss = loss + reinforce
        return loss, xe

    def _xe_epoch(self, epoch: int) -> float:
        cfg = self.cfg.xe
        order, mirror = epoch_order(self.pairs.image_index, captions_per_image=cfg.captions_per_image,
                                    mirror_share=cfg.mirror_share, seed=self.cfg.seed + epoch)
        batches = range(0, len(order), cfg.batch_size)
        self._train_mode()
        losses = []
        bar = tqdm(batches, desc=f"xe epoch {epoch + 1}/{cfg.epochs}", unit="batch", leave=False,
                   disable=not self.dist.is_main)
        for start in bar:
            if cfg.max_steps and self.state.step >= cfg.max_steps:
                break
            batch = order[start:start + cfg.batch_size]
            if len(batch) < self.dist.world_size:  # a last global batch too small to give every rank a row
                break
            rows = distributed.shard(batch, self.dist)
            loss, xe = self._xe_loss(rows, mirror[rows], len(batch))
            factor = lr_factor(self.state.step, warmup=self.cfg.optim.warmup_steps, total=cfg.epochs * len(batches))
            self._set_lr(self.cfg.optim.lr * factor)
            self._update(loss)
            losses.append(distributed.global_sum(xe.detach()).item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", lr=f"{self.optimizer.param_groups[0]['lr']:.1e}")
        bar.close()
        return float(np.mean(losses)) if losses else float("nan")

    def _scst_loss(self, rows: np.ndarray, flipped: np.ndarray) -> tuple[torch.Tensor, float]:
        """(policy-gradient loss, mean sample reward) of this rank's images ``rows``; a flipped photo is scored
        against its own references (left and right swapped)."""
        cfg = self.cfg.scst
        features = self.train_features.get(rows, flipped)
        ids = [mirrored_id(self.train_records[r].image_id) if f else self.train_records[r].image_id
               for r, f in zip(rows, flipped, strict=True)]
        objective = self_critical_objective(self.spec.model_id, cfg.objective)
        return objective(self.model.decoder, features, ids, cider=self.train_cider, vocab=self.vocab,
                         samples=cfg.samples, max_length=self.cfg.max_caption_length, baseline=cfg.baseline)

    def _scst_epoch(self, epoch: int) -> float:
        cfg = self.cfg.scst
        if self.train_cider is None:
            self.train_cider = CiderD(tokenised_references(self.train_records, mirrored=cfg.mirror_share > 0),
                                      end_token=SPECIALS[EOS] if cfg.score_end else None)
        order = np.random.default_rng(self.cfg.seed + 1000 + epoch).permutation(len(self.train_records))
        flipped = np.random.default_rng(self.cfg.seed + 3000 + epoch).random(len(order)) < cfg.mirror_share
        self._train_mode()
        rewards = []
        bar = tqdm(range(0, len(order), cfg.batch_images), desc=f"scst epoch {epoch + 1}/{cfg.epochs}",
                   unit="batch", leave=False, disable=not self.dist.is_main)
        for start in bar:
            batch = order[start:start + cfg.batch_images]
            if len(batch) < self.dist.world_size:  # a last global batch too small to give every rank an image
                break
            rows = distributed.shard(batch, self.dist)  # each rank samples captions for its own images
            loss, reward = self._scst_loss(rows, flipped[rows])
            self._update(loss)
            rewards.append(distributed.global_mean(reward, len(rows), self.dist))
            bar.set_postfix(reward=f"{100 * np.mean(rewards[-20:]):.1f}")
        bar.close()
        return 100.0 * float(np.mean(rewards))

    # -- the run ---------------------------------------------------------------------------------------------
    def _end_epoch(self, phase: str, epoch: int, train_value: float, started: float) -> None:
        # Rank 0 alone evaluates and writes; every rank takes its score, so all make the same selection and
        # early-stopping decisions and leave the loop together. With a weight average, it is what is scored
        # and kept; last.pt keeps the raw weights training goes on from.
        with self.average.applied() if self.average else contextlib.nullcontext():
            dev_cider = distributed.broadcast(self.evaluate() if self.dist.is_main else None, self.dist)
            improved = self.state.record(dev_cider)
            metrics = {"phase": phase, "epoch": epoch + 1, "step": self.state.step, "dev_cider": round(dev_cider, 3),
                       ("train_loss" if phase == "xe" else "train_reward"): round(train_value, 4),
                       "seconds": round(time.time() - started, 1)}
            if improved and self.dist.is_main:
                save_atomic(self._payload(metrics), self.run_dir / "best.pt")
        self.state.epoch = epoch + 1
        if self.dist.is_main:
            self._log(metrics)
            self.save_last(metrics)
            tqdm.write(f"{phase} epoch {epoch + 1}: {'loss' if phase == 'xe' else 'reward'} {train_value:.3f}  "
                       f"dev CIDEr-D {dev_cider:.2f}{'  (best)' if improved else ''}")
        distributed.barrier(self.dist)  # best.pt is whole before any rank reads it to start self-critical training

    def _start_scst(self) -> None:
        if self.cfg.xe.epochs:  # else the run starts here, from train.init's weights
            self._load_weights(read_checkpoint(self.run_dir / "best.pt"))
        if self.average:
            self.average.reset()
        self.optimizer = self._optimizer(self.cfg.scst.lr)
        self.state.start_phase("scst")

    def _phase_over(self, epochs: int) -> bool:
        out_of_steps = self.state.phase == "xe" and self.cfg.xe.max_steps and self.state.step >= self.cfg.xe.max_steps
        return self.state.epoch >= epochs or self.state.bad_epochs >= self.cfg.select.patience or bool(out_of_steps)

    def run(self) -> dict:
        while self.state.phase == "xe":
            if self._phase_over(self.cfg.xe.epochs):
                if self.cfg.scst.epochs:
                    self._start_scst()
                else:
                    self.state.phase = "done"
                break
            started = time.time()
            self._end_epoch("xe", self.state.epoch, self._xe_epoch(self.state.epoch), started)
        while self.state.phase == "scst":
            if self._phase_over(self.cfg.scst.epochs):
                self.state.phase = "done"
                break
            started = time.time()
            self._end_epoch("scst", self.state.epoch, self._scst_epoch(self.state.epoch), started)
        self.save_last({"best_dev_cider": self.state.best_cider})
        return {"best_dev_cider": self.state.best_cider, "steps": self.state.step}


def train(*, run_dir: Path, spec: RunSpec | None, resume: bool, changes: Sequence[str] = (),
          cache_dir: Path | None = None, nproc: int = 1) -> dict:
    """Train (or resume) a run directory; returns the best dev CIDEr-D and the step count.

    A resumed run takes its spec from ``config.json`` with ``changes`` (``SECTION.FIELD=VALUE``, see
    ``runs.RESUMABLE``) applied and written back. ``nproc`` > 1 spawns that many data-parallel ranks on this
    machine, which split every global batch. Under torchrun every rank calls this with ``nproc=1``. Rank 0 prepares
    the run directory, the dataset and the feature cache first; the others then read them.
    """
    if nproc != 1:
        distributed.check_world_size(nproc, run_spec(run_dir=run_dir, spec=spec, resume=resume, changes=changes).train)
        return distributed.launch(nproc, train, run_dir=run_dir, spec=spec, resume=resume, changes=changes,
                                  cache_dir=cache_dir)
    with distributed.process_group() as ctx, (writing(run_dir, "edgecap train") if ctx.is_main
                                              else contextlib.nullcontext()):
        with distributed.main_first(ctx):
            spec = run_spec(run_dir=run_dir, spec=spec, resume=resume, changes=changes)
            distributed.check_world_size(ctx.world_size, spec.train)
            # Every input is read and checked (data, encoder, train.init) before the run directory is written.
            trainer = Trainer(run_dir, spec, load_dataset(spec.data), cache_dir=cache_dir, ctx=ctx)
            if ctx.is_main:
                write_run_files(run_dir, spec, trainer.vocab, new=not resume)
        if ctx.is_main:
            tqdm.write(trainer.describe())
        if resume:
            trainer.resume()
        else:
            trainer.start_from_init()
        return trainer.run()
