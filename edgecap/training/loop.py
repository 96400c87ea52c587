"""The training run: cross-entropy with teacher forcing, then self-critical CIDEr-D training.

A run directory holds the resolved ``config.json``, the command line, ``vocab.json``,
``metrics.jsonl``, ``best.pt`` (selected on dev CIDEr) and ``last.pt`` (everything
needed to resume). Checkpoints are written at the end of every epoch, atomically,
so a kill loses at most the epoch in progress.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgecap.checkpoint import checkpoint_payload, on_cpu, read_checkpoint, save_atomic
from edgecap.cider import CiderD
from edgecap.config import TrainConfig
from edgecap.data import CaptionDataset, load_dataset
from edgecap.data.views import MIRRORED, ZOOMED, View
from edgecap.errors import ModelError
from edgecap.models import build_model
from edgecap.models.caption_model import CaptionModel
from edgecap.models.encoder import build_encoder, grid_features
from edgecap.preprocess import Preprocessing
from edgecap.runtime.search import SearchOptions
from edgecap.torch_backend import captions_of, search_features
from edgecap.training import distributed
from edgecap.training.c2f import c2f_loss
from edgecap.training.data import ImageFeatures, caption_pairs, mirrored_id, mirrored_token_table, tokenised_references
from edgecap.training.ema import WeightAverage
from edgecap.training.hard_attention import expected_context_logprob
from edgecap.training.runs import RunSpec, run_spec
from edgecap.training.scst import scst_loss
from edgecap.vocab import PAD, Vocab
from edgecap.weight_storage import stored_weights


def _lr_factor(step: int, *, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _smoothed_nll(logprobs: torch.Tensor, nll: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-token cross-entropy against (1 - eps) one-hot + eps uniform; eps 0 is the plain nll."""
    return nll if not eps else (1 - eps) * nll - eps * logprobs.mean(-1)


class Trainer:
    """Owns the model, optimiser and data of one run directory (on one rank of ``ctx`` when distributed)."""

    def __init__(self, run_dir: Path, spec: RunSpec, dataset: CaptionDataset, *, cache_dir: Path | None = None,
                 ctx: distributed.Context | None = None):
        self.run_dir, self.spec, self.cfg = run_dir, spec, spec.train
        self.dist = ctx or distributed.Context()
        torch.manual_seed(self.cfg.seed)
        self.train_records, self.dev_records = dataset.split("train"), dataset.split("dev")
        if self.cfg.eval_images:
            self.dev_records = self.dev_records[: self.cfg.eval_images]
        vocab_file = run_dir / "vocab.json"
        # A new run has no last.pt (train() refuses any other mix of --resume and run directory); files that a
        # new run killed before its first checkpoint left behind are rewritten, never read.
        resuming = (run_dir / "last.pt").exists()
        self.init = read_checkpoint(Path(self.cfg.init)) if self.cfg.init and not resuming else None
        if resuming:
            self.vocab = Vocab.from_json(json.loads(vocab_file.read_text()))
        elif self.init:  # the decoder's embedding and output rows are this vocabulary's words
            self.vocab = Vocab.from_json(self.init["vocab"])
        else:
            self.vocab = Vocab.build((c for r in self.train_records for c in r.captions),
                                     min_count=self.cfg.min_word_count)
        if not resuming and self.dist.is_main:
            self.vocab.save(vocab_file)
        self.prep = Preprocessing(image_size=spec.encoder.image_size)
        encoder = build_encoder(spec.encoder)
        with torch.no_grad():
            probe = grid_features(encoder.eval(), torch.zeros(1, 3, self.prep.image_size, self.prep.image_size))
        model_config = {"vocab_size": len(self.vocab), "feature_dim": probe.shape[2], "num_locations": probe.shape[1],
                        **spec.model}
        self.captioner = distributed.prepare_module(CaptionModel(encoder, build_model(spec.model_id, model_config)),
                                                    self.dist)
        if not spec.encoder.finetune:
            self.captioner.encoder.requires_grad_(False)
        self.pairs = caption_pairs(self.train_records, self.vocab, max_length=self.cfg.max_caption_length)
        self.train_features = ImageFeatures(self.train_records, self.captioner, spec.encoder, self.prep,
                                            cache_dir=cache_dir, label="train features",
                                            views=training_views(self.cfg))
        self.mirrored_tokens = mirrored_token_table(self.vocab)
        self.dev_features = ImageFeatures(self.dev_records, self.captioner, spec.encoder, self.prep,
                                          cache_dir=cache_dir, label="dev features")
        self.dev_cider = CiderD(tokenised_references(self.dev_records))
        self.train_cider: CiderD | None = None  # built when the self-critical phase starts
        self.state = {"phase": "xe", "epoch": 0, "step": 0, "best_cider": -1.0, "phase_best": -1.0, "bad_epochs": 0,
                      "hard_baseline": 0.0}
        self.optimizer = self._optimizer(self.cfg.lr)
        self.average = WeightAverage(self.captioner, self.cfg.ema_decay) if self.cfg.ema_decay else None

    def start_from_init(self) -> None:
        """Load ``train.init``'s decoder (and its encoder when the encoder trains) into a new run's model."""
        if self.init is None:
            return
        source, payload = self.cfg.init, self.init
        decoder_config = asdict(self.captioner.decoder.config)
        if payload["model_id"] != self.spec.model_id or payload["model_config"] != decoder_config:
            differ = sorted(k for k in decoder_config if payload["model_config"].get(k) != decoder_config[k])
            raise ModelError(f"{source}: train.init holds a {payload['model_id']} decoder that differs from this "
                             f"run's {self.spec.model_id} in {', '.join(differ) or 'its model'}; pass a checkpoint "
                             "of the same model, encoder and --set model.* options")
        self.captioner.decoder.load_state_dict(stored_weights(payload["decoder"]))
        if self.spec.encoder.finetune and payload["encoder"] is not None:
            try:
                self.captioner.encoder.load_state_dict(stored_weights(payload["encoder"]))
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
        trainable = sum(p.numel() for p in self.captioner.parameters() if p.requires_grad)
        return (f"{self.run_dir}: {self.spec.model_id}, {trainable / 1e6:.1f} M trainable parameters on {where}; "
                f"{len(self.train_records)} training photos ({len(self.pairs.tokens)} captions), "
                f"{len(self.dev_records)} dev photos")

    def _optimizer(self, lr: float) -> torch.optim.Optimizer:
        """AdamW over the decoder and, when it trains, the encoder at ``encoder_lr / lr`` of the rate (its scale)."""
        groups = [{"params": list(self.captioner.decoder.parameters()), "scale": 1.0}]
        encoder = [p for p in self.captioner.encoder.parameters() if p.requires_grad]
        if encoder:
            scale = self.cfg.encoder_lr / self.cfg.lr if self.cfg.encoder_lr else 1.0
            groups.append({"params": encoder, "scale": scale})
        for group in groups:
            group["lr"] = lr * group["scale"]
        return torch.optim.AdamW(groups, lr=lr, weight_decay=self.cfg.weight_decay)

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("scale", 1.0)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _payload(self, metrics: dict) -> dict:
        return checkpoint_payload(self.captioner, model_id=self.spec.model_id, vocab=self.vocab, prep=self.prep,
                                  encoder_config=self.spec.encoder, metrics=metrics)

    def save_last(self, metrics: dict) -> None:
        if not self.dist.is_main:
            return
        payload = self._payload(metrics)
        payload["train_state"] = {**self.state, "optimizer": on_cpu(self.optimizer.state_dict())}
        if self.average:
            payload["train_state"]["weight_average"] = self.average.state_dict()
        save_atomic(payload, self.run_dir / "last.pt")

    def resume(self) -> None:
        payload = read_checkpoint(self.run_dir / "last.pt")
        self._load_weights(payload)
        train_state = dict(payload["train_state"])
        if train_state["phase"] == "done":
            self._reopen_finished(train_state)
        if train_state["phase"] == "scst":
            self.optimizer = self._optimizer(self.cfg.scst_lr)
        self.optimizer.load_state_dict(train_state.pop("optimizer"))
        average = train_state.pop("weight_average", None)
        if self.average and average:
            self.average.load_state_dict(average)
        if train_state["phase"] == "scst":  # the self-critical rate is constant: take it from config.json
            self._set_lr(self.cfg.scst_lr)
        self.state.update(train_state)

    def _reopen_finished(self, state: dict) -> None:
        """A finished run continues when config.json was given more epochs since: a self-critical phase added
        after cross-entropy starts (after any cross-entropy epochs added too), else the last phase goes on with a
        fresh patience."""
        last = json.loads((self.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["phase"]
        limit = self.cfg.scst_epochs if last == "scst" else self.cfg.epochs
        if last == "xe" and self.cfg.scst_epochs:
            state.update(phase="xe")  # run() moves on to self-critical training once cross-entropy is over
        elif state["epoch"] < limit:
            state.update(phase=last, bad_epochs=0)
        if self.dist.is_main:
            limits = f"train.epochs={self.cfg.epochs}, train.scst_epochs={self.cfg.scst_epochs}"
            tqdm.write(f"{self.run_dir}: reopening the finished run ({limits})" if state["phase"] != "done" else
                       f"{self.run_dir}: already finished ({limits}); more epochs continue it, e.g. --resume "
                       "--scst-epochs N or --resume --set train.epochs=N")

    def _load_weights(self, payload: dict) -> None:
        self.captioner.decoder.load_state_dict(payload["decoder"])
        if payload["encoder"] is not None:
            self.captioner.encoder.load_state_dict(payload["encoder"])

    def _log(self, record: dict) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- evaluation --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        """Dev CIDEr-D (0-100 scale) of beam search through the runtime's search, the number selection uses."""
        self.captioner.eval()
        options = SearchOptions(beam_size=self.cfg.eval_beam, max_length=self.cfg.max_caption_length)
        features = self.dev_features.get(np.arange(len(self.dev_records))).cpu()
        decoder = self.captioner.decoder
        if self.dist.device.type != "cpu":  # the runtime's search feeds the decoder CPU tensors
            decoder = copy.deepcopy(decoder).cpu()
        captions = captions_of(search_features(decoder, features, self.vocab, options), self.vocab)
        ids = [r.image_id for r in self.dev_records]
        return 100.0 * float(self.dev_cider.score(ids, [c.split() for c in captions]).mean())

    # -- one epoch of each phase -------------------------------------------------------------------------------
    def _update(self, loss: torch.Tensor) -> None:
        """One optimiser step on ``loss``: gradients summed over ranks (a no-op alone), clipped, then applied."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(self.captioner, self.dist)
        torch.nn.utils.clip_grad_norm_(self.captioner.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        if self.average:
            self.average.update()
        self.state["step"] += 1

    def _train_mode(self) -> None:
        """Train mode, except what stays fixed: a frozen encoder, or a fine-tuned one's BatchNorm statistics."""
        self.captioner.train()
        if not self.spec.encoder.finetune:
            self.captioner.encoder.eval()
        elif self.spec.encoder.frozen_batchnorm:
            for module in self.captioner.encoder.modules():
                if isinstance(module, (torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm)):
                    module.eval()

    def _xe_epoch(self, epoch: int) -> float:
        cfg = self.cfg
        hard = getattr(self.captioner.decoder.config, "attention", "soft") == "hard"
        order = np.random.default_rng(cfg.seed + epoch).permutation(len(self.pairs.tokens))
        mirror = np.random.default_rng(cfg.seed + 2000 + epoch).random(len(order)) < cfg.mirror_share  # per pair
        views = [MIRRORED if flipped else None for flipped in mirror]
        batches = range(0, len(order), cfg.batch_size)
        total_steps = cfg.epochs * len(batches)
        self._train_mode()
        losses = []
        bar = tqdm(batches, desc=f"xe epoch {epoch + 1}/{cfg.epochs}", unit="batch", leave=False,
                   disable=not self.dist.is_main)
        for start in bar:
            if cfg.max_steps and self.state["step"] >= cfg.max_steps:
                break
            batch = order[start:start + cfg.batch_size]
            if len(batch) < self.dist.world_size:  # a last global batch too small to give every rank a row
                break
            rows = distributed.shard(batch, self.dist)
            tokens = torch.from_numpy(self.pairs.batch(rows, mirror[rows], self.mirrored_tokens))
            length = int((tokens != PAD).sum(1).max())
            tokens = tokens[:, :length].to(self.dist.device)
            features = self.train_features.get(self.pairs.image_index[rows], [views[r] for r in rows])
            if hard:
                expected = torch.rand(len(rows), device=self.dist.device) < cfg.hard_expected_share
                out = self.captioner.decoder(features, tokens[:, :-1], hard=True, expected=expected)
            else:
                out = self.captioner.decoder(features, tokens[:, :-1])
            target = tokens[:, 1:]
            mask = (target != PAD).float()
            # Means over the global batch: this rank's sum over the global count; gradients are summed over ranks.
            n_tokens, n_rows = distributed.global_sum(mask.sum()), len(batch)
            nll = -out["logprobs"].gather(-1, target.unsqueeze(-1)).squeeze(-1)
            xe = (nll * mask).sum() / n_tokens
            loss = (_smoothed_nll(out["logprobs"], nll, cfg.label_smoothing) * mask).sum() / n_tokens
            for stage in out.get("stage_logprobs", ()):  # coarse-to-fine models: every earlier stage's XE too
                stage_nll = -stage.gather(-1, target.unsqueeze(-1)).squeeze(-1)
                loss = loss + (_smoothed_nll(stage, stage_nll, cfg.label_smoothing) * mask).sum() / n_tokens
            if "auxiliary_loss" in out:  # a model's own extra objective, already weighted (A²'s mask, GLIED's MIL)
                loss = loss + out["auxiliary_loss"] * (len(rows) / n_rows)  # a mean over this rank's rows
            if cfg.doubly_stochastic and "alpha" in out:
                coverage = (out["alpha"] * mask.unsqueeze(-1)).sum(1)
                loss = loss + cfg.doubly_stochastic * ((1 - coverage) ** 2).sum() / (n_rows * coverage.shape[1])
            if hard:
                # The paper adds lambda_r (log p(y|s,a) - b) dlog p(s|a) and lambda_e dH[s] to each caption's
                # dlog p(y|s,a); that likelihood term is a mean over tokens here, so they are too (per caption they
                # would outweigh it by the caption's length). REINFORCE acts on the sampled rows, and the moving
                # baseline b tracks their log p(y|s,a) only; the "caption" baseline is each one's own.
                seq_logprob = -(nll * mask).sum(1).detach()
                if cfg.hard_baseline == "caption":
                    baseline = expected_context_logprob(self.captioner.decoder, features, tokens, ~expected)
                else:
                    baseline = self.state["hard_baseline"]
                    sampled = (~expected).float()
                    n_sampled = float(distributed.global_sum(sampled.sum()))
                    if n_sampled:
                        batch_mean = float(distributed.global_sum((seq_logprob * sampled).sum())) / n_sampled
                        decay = cfg.hard_baseline_decay
                        self.state["hard_baseline"] = decay * baseline + (1 - decay) * batch_mean
                location_logprob = (out["location_logprob"] * mask).sum(1)
                entropy = (out["entropy"] * mask).sum(1)
                reinforce = ((seq_logprob - baseline) * location_logprob).sum()
                loss = loss - (cfg.hard_reinforce_weight * reinforce + cfg.hard_entropy * entropy.sum()) / n_tokens
            self._set_lr(cfg.lr * _lr_factor(self.state["step"], warmup=cfg.warmup_steps, total=total_steps))
            self._update(loss)
            losses.append(distributed.global_sum(xe.detach()).item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", lr=f"{self.optimizer.param_groups[0]['lr']:.1e}")
        bar.close()
        return float(np.mean(losses)) if losses else float("nan")

    def _scst_epoch(self, epoch: int) -> float:
        cfg = self.cfg
        if self.train_cider is None:
            self.train_cider = CiderD(tokenised_references(self.train_records, mirrored=cfg.scst_mirror_share > 0))
        order = np.random.default_rng(cfg.seed + 1000 + epoch).permutation(len(self.train_records))
        views = scst_views(cfg, epoch, len(order))  # per image
        self._train_mode()
        rewards = []
        bar = tqdm(range(0, len(order), cfg.scst_batch_images), desc=f"scst epoch {epoch + 1}/{cfg.scst_epochs}",
                   unit="batch", leave=False, disable=not self.dist.is_main)
        for start in bar:
            batch = order[start:start + cfg.scst_batch_images]
            if len(batch) < self.dist.world_size:  # a last global batch too small to give every rank an image
                break
            rows = distributed.shard(batch, self.dist)  # each rank samples captions for its own images
            features = self.train_features.get(rows, [views[r] for r in rows])
            image_ids = [self.train_records[r].image_id for r in rows]  # a flipped view has its own references
            ids = [mirrored_id(i) if views[r] is MIRRORED else i for r, i in zip(rows, image_ids, strict=True)]
            decoder = self.captioner.decoder
            if hasattr(decoder, "stage_step"):  # coarse-to-fine models: C2F RL (eq. 15)
                loss, reward = c2f_loss(decoder, features, ids, cider=self.train_cider, vocab=self.vocab,
                                        samples=cfg.scst_samples, max_length=cfg.max_caption_length,
                                        baseline=cfg.scst_baseline)
            else:
                loss, reward = scst_loss(decoder, features, ids, cider=self.train_cider, vocab=self.vocab,
                                         samples=cfg.scst_samples, max_length=cfg.max_caption_length,
                                         baseline=cfg.scst_baseline)
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
            improved = record_dev_score(self.state, dev_cider)
            metrics = {"phase": phase, "epoch": epoch + 1, "step": self.state["step"],
                       "dev_cider": round(dev_cider, 3),
                       ("train_loss" if phase == "xe" else "train_reward"): round(train_value, 4),
                       "seconds": round(time.time() - started, 1)}
            if improved and self.dist.is_main:
                save_atomic(self._payload(metrics), self.run_dir / "best.pt")
        self.state["epoch"] = epoch + 1
        if self.dist.is_main:
            self._log(metrics)
            self.save_last(metrics)
            tqdm.write(f"{phase} epoch {epoch + 1}: {'loss' if phase == 'xe' else 'reward'} {train_value:.3f}  "
                       f"dev CIDEr-D {dev_cider:.2f}{'  (best)' if improved else ''}")
        distributed.barrier(self.dist)  # best.pt is whole before any rank reads it to start self-critical training

    def _start_scst(self) -> None:
        if self.cfg.epochs:  # else the run starts here, from train.init's weights
            self._load_weights(read_checkpoint(self.run_dir / "best.pt"))
        if self.average:
            self.average.reset()
        self.optimizer = self._optimizer(self.cfg.scst_lr)
        self.state.update(phase="scst", epoch=0, bad_epochs=0, phase_best=-1.0)

    def run(self) -> dict:
        cfg = self.cfg
        while self.state["phase"] == "xe":
            epoch = self.state["epoch"]
            out_of_steps = cfg.max_steps and self.state["step"] >= cfg.max_steps
            if epoch >= cfg.epochs or self.state["bad_epochs"] >= cfg.patience or out_of_steps:
                if cfg.scst_epochs:
                    self._start_scst()
                else:
                    self.state["phase"] = "done"
                break
            started = time.time()
            self._end_epoch("xe", epoch, self._xe_epoch(epoch), started)
        while self.state["phase"] == "scst":
            epoch = self.state["epoch"]
            if epoch >= cfg.scst_epochs or self.state["bad_epochs"] >= cfg.patience:
                self.state["phase"] = "done"
                break
            started = time.time()
            self._end_epoch("scst", epoch, self._scst_epoch(epoch), started)
        self.save_last({"best_dev_cider": self.state["best_cider"]})
        return {"best_dev_cider": self.state["best_cider"], "steps": self.state["step"]}


def training_views(cfg: TrainConfig) -> tuple[View, ...]:
    """The views of the training photos a run's shares ask for, besides the photos themselves."""
    mirrored = (MIRRORED,) if cfg.mirror_share > 0 or cfg.scst_mirror_share > 0 else ()
    return mirrored + (ZOOMED if cfg.scst_zoom_share > 0 else ())


def scst_views(cfg: TrainConfig, epoch: int, n: int) -> list[View | None]:
    """Each training photo's view in a self-critical epoch: flipped at ``scst_mirror_share``, else zoomed into one
    of four corners at ``scst_zoom_share``, else itself (None). The flips are drawn as before zooms existed."""
    flipped = np.random.default_rng(cfg.seed + 3000 + epoch).random(n) < cfg.scst_mirror_share
    draw = np.random.default_rng(cfg.seed + 4000 + epoch)
    zoomed, corner = draw.random(n) < cfg.scst_zoom_share, draw.integers(len(ZOOMED), size=n)
    return [MIRRORED if f else ZOOMED[c] if z else None for f, z, c in zip(flipped, zoomed, corner, strict=True)]


def record_dev_score(state: dict, dev_cider: float) -> bool:
    """Update the selection and patience counters of ``state`` with an epoch's dev score; True if best overall.

    Patience counts epochs without a better score in the current phase, not overall: a self-critical phase
    selected at beam 3 starts below the cross-entropy best and climbs past it only after a few epochs.
    ``best.pt`` still changes only for the best score overall.
    """
    if dev_cider > state["phase_best"]:
        state["phase_best"], state["bad_epochs"] = dev_cider, 0
    else:
        state["bad_epochs"] += 1
    improved = dev_cider > state["best_cider"]
    if improved:
        state["best_cider"] = dev_cider
    return improved


def train(*, run_dir: Path, spec: RunSpec | None, resume: bool, changes: Sequence[str] = (),
          cache_dir: Path | None = None, nproc: int = 1) -> dict:
    """Train (or resume) a run directory; returns the best dev CIDEr-D and the step count.

    A resumed run takes its spec from ``config.json`` with ``changes`` (``train.FIELD=VALUE``, see
    ``RESUMABLE_FIELDS``) applied and written back. ``nproc`` > 1 spawns that many data-parallel ranks on this
    machine, which split every global batch of ``train.batch_size``. Under torchrun every rank calls this with
    ``nproc=1``. Rank 0 prepares the run directory, the dataset and the feature cache first; the others then read
    them.
    """
    if nproc != 1:
        distributed.check_world_size(nproc, run_spec(run_dir=run_dir, spec=spec, resume=resume, changes=changes).train)
        return distributed.launch(nproc, train, run_dir=run_dir, spec=spec, resume=resume, changes=changes,
                                  cache_dir=cache_dir)
    with distributed.process_group() as ctx:
        with distributed.main_first(ctx):
            spec = run_spec(run_dir=run_dir, spec=spec, resume=resume, changes=changes)
            distributed.check_world_size(ctx.world_size, spec.train)
            if ctx.is_main:
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / "config.json").write_text(json.dumps(asdict(spec), indent=2))
                with open(run_dir / "command.txt", "a") as f:
                    f.write(" ".join(sys.argv) + "\n")
            trainer = Trainer(run_dir, spec, load_dataset(spec.data), cache_dir=cache_dir, ctx=ctx)
        if ctx.is_main:
            tqdm.write(trainer.describe())
        if resume:
            trainer.resume()
        else:
            trainer.start_from_init()
        return trainer.run()
