"""Data-parallel training on one machine: process group, rank helpers and the reductions the loop needs.

Launched by ``torchrun --nproc-per-node N -m edgecap.train`` (which sets RANK, LOCAL_RANK and
WORLD_SIZE) or by ``edgecap train --nproc N`` (``launch`` spawns the ranks and sets the same
variables). Backend nccl with one GPU per rank when CUDA is available, gloo on CPU otherwise.
Without those variables nothing here touches ``torch.distributed``: a single-process run has
no process group and every helper returns its input.

Every rank takes a disjoint slice of each global batch. Each rank's loss is its local sum over
the *global* count (tokens or rows), and gradients are summed over ranks, so the update equals
the single-process update of the whole global batch. Gradients are reduced explicitly after
``backward`` rather than by DistributedDataParallel: the self-critical phases sample through
``decoder.prepare``/``step``, which bypass ``DDP.forward``, and DDP's hooks would then silently
skip the reduction.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from edgecap.config import TrainConfig
from edgecap.errors import EdgecapError

# Ranks wait while rank 0 builds the feature cache or evaluates on dev: minutes on a large dataset,
# more than the default collective timeout (10 min for nccl).
TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class Context:
    """This process's place in the run; the defaults are a single-process run."""

    rank: int = 0  # global rank; 0 writes checkpoints, metrics and evaluates on dev
    world_size: int = 1  # processes in the run
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this rank trains

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def world_size_from_env() -> int:
    """WORLD_SIZE as set by torchrun or ``launch``; 1 when not launched as ranks."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_world_size(world_size: int, cfg: TrainConfig) -> None:
    """Every rank needs at least one row of every global batch, and a GPU of its own under CUDA."""
    if world_size < 1:
        raise EdgecapError(f"--nproc {world_size}: expected 1 or more processes")
    if world_size > cfg.xe.batch_size:
        raise EdgecapError(f"{world_size} processes but xe.batch_size={cfg.xe.batch_size}: each process takes a "
                           "slice of every global batch, so use at most batch_size processes")
    if cfg.scst.epochs and world_size > cfg.scst.batch_images:
        raise EdgecapError(f"{world_size} processes but scst.batch_images={cfg.scst.batch_images}: each process "
                           "takes a slice of every global batch, so use at most batch_images processes")
    if world_size > 1 and torch.cuda.is_available() and world_size > torch.cuda.device_count():
        raise EdgecapError(f"{world_size} processes but {torch.cuda.device_count()} GPUs: one GPU per process")


@contextmanager
def process_group() -> Iterator[Context]:
    """The Context of this process, with its process group joined for the block when launched as ranks."""
    world_size = world_size_from_env()
    if world_size == 1:  # one process trains on the GPU when there is one
        yield Context(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=TIMEOUT)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=TIMEOUT)
    try:
        yield Context(rank=rank, world_size=world_size, device=device)
        dist.barrier()  # leave together: a gloo rank torn down while rank 0 still writes its files can abort (SIGABRT)
    finally:
        dist.destroy_process_group()


@contextmanager
def main_first(ctx: Context) -> Iterator[None]:
    """Rank 0 runs the block first (writing the run directory, dataset and feature caches); the others after it,
    reading what it wrote."""
    if not ctx.is_main:
        dist.barrier()
    yield
    if ctx.is_main and ctx.distributed:
        dist.barrier()


def barrier(ctx: Context) -> None:
    if ctx.distributed:
        dist.barrier()


def shard(rows: np.ndarray, ctx: Context) -> np.ndarray:
    """This rank's contiguous, disjoint slice of a global batch (sizes differ by at most one)."""
    return np.array_split(rows, ctx.world_size)[ctx.rank] if ctx.distributed else rows


def global_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over ranks (a detached copy); ``value`` itself in a single-process run."""
    if not dist.is_initialized():
        return value
    total = value.detach().clone()
    dist.all_reduce(total)
    return total


def global_mean(value: float, count: int, ctx: Context) -> float:
    """The mean over all ranks of per-rank means ``value``, each over ``count`` items."""
    if not ctx.distributed:
        return value
    totals = global_sum(torch.tensor([value * count, count], dtype=torch.float64, device=ctx.device))
    return float(totals[0] / totals[1])


def broadcast(value: object, ctx: Context) -> object:
    """Rank 0's ``value`` on every rank (a decision only rank 0 can make, such as the dev score)."""
    if not ctx.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_gradients(module: nn.Module, ctx: Context) -> None:
    """Sum the gradients over ranks in one flat all-reduce.

    Parameters without a gradient stay without one (AdamW skips them, as in one process); every
    rank runs the same code path, so every rank has gradients for the same parameters.
    """
    if not ctx.distributed:
        return
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for grad, chunk in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        grad.copy_(chunk.view_as(grad))


def prepare_module(module: nn.Module, ctx: Context) -> nn.Module:
    """The module on this rank's device; on CUDA ranks, BatchNorm normalises over the global batch as one
    process would (SyncBatchNorm is CUDA-only, so gloo ranks keep per-slice statistics)."""
    if ctx.distributed and ctx.device.type == "cuda":
        module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return module.to(ctx.device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, nproc: int, port: int, fn: Callable[..., object], kwargs: dict, results) -> None:
    """One spawned rank: the environment torchrun would set, then ``fn``; a user error exits 2 like the CLI."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))  # ranks share the cores instead of fighting
    try:
        result = fn(**kwargs)
    except EdgecapError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None
    if rank == 0:
        results.put(result)


def launch(nproc: int, fn: Callable[..., object], **kwargs) -> object:
    """Run ``fn(**kwargs)`` as ranks 0..nproc-1 of one process group on this machine; rank 0's return value.

    A rank that stops on a user error (exit 2) becomes one EdgecapError here; any other failure keeps
    its traceback. ``fn`` and ``kwargs`` must be picklable (processes are spawned, not forked).
    """
    if world_size_from_env() > 1:
        raise EdgecapError(f"--nproc {nproc} inside a launched rank (WORLD_SIZE={world_size_from_env()}): "
                           "torchrun already starts the processes; drop --nproc")
    results = mp.get_context("spawn").SimpleQueue()
    try:
        mp.spawn(_worker, args=(nproc, _free_port(), fn, kwargs, results), nprocs=nproc)
    except mp.ProcessExitedException as err:
        if err.exit_code != EdgecapError.exit_code:
            raise
        raise EdgecapError(f"training rank {err.error_index} stopped on the error printed above") from None
    return results.get()
