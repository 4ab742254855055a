"""Data-parallel training under ``torchrun``: detection, process group, collectives.

``torchrun --nproc_per_node=N -m app train ...`` starts N copies of the
trainer. Each learns its place from the environment torchrun sets
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``);
:func:`process_group` joins them into one process group and leaves it on
exit, also when the body raises.

What the trainer does with it (``experiments/train.py``):

* ``--batch-size`` is the GLOBAL batch B. Every rank draws the same
  deterministic global batch (one generator, same seed) and keeps rows
  ``[rank * B/N, (rank + 1) * B/N)``, so N processes see exactly the samples
  one process sees. B must be divisible by N (:func:`check_global_batch`).
* The loss is the mean cross entropy over a rank's rows. DDP averages the
  gradients over ranks, and the mean of N equal-sized slice means is the
  global mean, so the averaged gradient is the one-process gradient (up to
  float summation order). Gradient clipping then acts on the averaged
  gradient, identically on every rank.
* Logged losses (training and validation) are averaged over ranks with
  ``all_reduce``: the same numbers one process logs.
* Only rank 0 writes (config, metrics, TensorBoard, checkpoints, resume
  state) and prints progress; all ranks read a resume state, so the run
  folder must be on a file system every rank sees when resuming.

Backend: ``nccl`` when the device is CUDA (``--device cuda`` becomes
``cuda:LOCAL_RANK``: one GPU per process), else ``gloo``.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch
import torch.distributed as tdist

from loaders.errors import QkvscopeError

#: set by torchrun for every worker; all of them, or none, must be present
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


class DistributedError(QkvscopeError):
    """torchrun settings or arguments that cannot train data-parallel as asked."""


@dataclass(frozen=True)
class TorchrunEnv:
    """A worker's place as torchrun describes it."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The torchrun worker settings in ``environ`` (default ``os.environ``), or None
    when none of ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` is set
    (a plain ``python -m app train``). Some but not all set, or values that are
    not consistent integers: :class:`DistributedError`."""
    environ = os.environ if environ is None else environ
    present = [v for v in TORCHRUN_VARS if v in environ]
    if not present:
        return None
    missing = [v for v in TORCHRUN_VARS if v not in environ]
    if missing:
        raise DistributedError(
            f"expected the torchrun environment variables {', '.join(TORCHRUN_VARS)} all set or none, "
            f"found {', '.join(present)} set and {', '.join(missing)} missing; "
            "start data-parallel training with torchrun --nproc_per_node=N -m app train ...")
    values = {}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        text = environ[var]
        try:
            values[var] = int(text)
        except ValueError:
            raise DistributedError(f"expected an integer in the environment variable {var}, "
                                   f"found {text!r}") from None
    rank, world, local = values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"]
    if world < 1 or not 0 <= rank < world or not 0 <= local <= rank:
        raise DistributedError(f"expected 0 <= LOCAL_RANK <= RANK < WORLD_SIZE, found RANK={rank}, "
                               f"WORLD_SIZE={world}, LOCAL_RANK={local}")
    return TorchrunEnv(rank=rank, world_size=world, local_rank=local, master_addr=environ["MASTER_ADDR"])


def resolve_device(device: str, local_rank: int, world_size: int) -> str:
    """The device one worker trains on: ``cpu`` stays ``cpu``; ``cuda`` becomes
    ``cuda:LOCAL_RANK`` (one GPU per process on each node). An explicit
    ``cuda:N`` is accepted only for a single worker, since N workers on one
    GPU would share it and N on the same named GPU is a mistake."""
    if device == "cpu":
        return "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    if device.startswith("cuda:"):
        if world_size == 1:
            return device
        raise DistributedError(f"expected --device cuda (each process takes cuda:LOCAL_RANK) or cpu under "
                               f"torchrun with {world_size} processes, found --device {device}")
    raise DistributedError(f"expected --device cpu or cuda under torchrun, found --device {device}")


def backend_for(device: str) -> str:
    """``nccl`` for CUDA devices, ``gloo`` for the CPU."""
    return "nccl" if device.startswith("cuda") else "gloo"


def check_global_batch(batch_size: int, world_size: int) -> int:
    """Rows per rank, B / N; :class:`DistributedError` unless N divides B."""
    if batch_size % world_size:
        lower = batch_size - batch_size % world_size
        upper = lower + world_size
        hint = f"{lower} or {upper}" if lower else f"{upper}"
        raise DistributedError(
            f"expected --batch-size (the global batch, split over all processes) divisible by the "
            f"{world_size} processes, found {batch_size} (remainder {batch_size % world_size}); "
            f"use {hint}")
    return batch_size // world_size


@dataclass(frozen=True)
class Dist:
    """One worker's view of the process group (created by :func:`process_group`)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str

    @property
    def is_main(self) -> bool:
        """Rank 0: the only one that writes files and prints progress."""
        return self.rank == 0

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch: x (B, ...) -> x[rank*B/N:(rank+1)*B/N] (B/N, ...)."""
        per = check_global_batch(x.shape[0], self.world_size)
        return x[self.rank * per:(self.rank + 1) * per]

    def all_mean(self, values: list[float]) -> list[float]:
        """Each value averaged over the ranks (float64 all_reduce sum / N)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return (t / self.world_size).tolist()

    def agree(self, error: BaseException | None) -> None:
        """A collective check point: raise ``error`` if this rank has one, else
        raise if any other rank has one, else return. Keeps every rank from
        going on (and blocking in a later collective) after one of them failed."""
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=self.device)
        tdist.all_reduce(flag, op=tdist.ReduceOp.SUM)
        if error is not None:
            raise error
        failed = int(flag.item())
        if failed:
            raise DistributedError(f"rank {self.rank}: expected every process to start the run, "
                                   f"found {failed} that could not (its error is printed by that rank)")

    def barrier(self) -> None:
        tdist.barrier()


@contextmanager
def process_group(device: str, environ: Mapping[str, str] | None = None) -> Iterator[Dist | None]:
    """Join torchrun's process group for the body; yields None outside torchrun.

    Backend ``nccl`` on CUDA, else ``gloo``; rendezvous through torchrun's
    ``MASTER_ADDR``/``MASTER_PORT`` (``env://``). ``destroy_process_group``
    runs when the body ends, also when it raises; a body that ends normally
    first meets the other ranks at a barrier.
    """
    env = torchrun_env(environ)
    if env is None:
        yield None
        return
    dev = resolve_device(device, env.local_rank, env.world_size)
    backend = backend_for(dev)
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DistributedError(f"expected a CUDA device for --device {device}, found none "
                                   "(torch.cuda.is_available() is False)")
        if torch.device(dev).index >= torch.cuda.device_count():
            raise DistributedError(f"expected GPU {dev} for local rank {env.local_rank}, found "
                                   f"{torch.cuda.device_count()} GPU(s) on this node; "
                                   "use at most that many processes per node")
        torch.cuda.set_device(dev)
    # device_id binds the nccl communicator to this process's GPU (collectives
    # and barriers then never guess a device); gloo needs none
    tdist.init_process_group(backend=backend, init_method="env://", rank=env.rank,
                             world_size=env.world_size,
                             device_id=torch.device(dev) if backend == "nccl" else None)
    try:
        yield Dist(rank=env.rank, world_size=env.world_size, local_rank=env.local_rank,
                   backend=backend, device=dev)
        # A rank that tears gloo down while another still uses the group can abort
        # at exit ("terminate called without an active exception"): on a normal
        # end every rank waits here, so all destroy the group together.
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def refuse_under_torchrun(command: str, environ=None) -> None:
    """Commands that start their own training processes (sweep, demo) must not
    run once per torchrun rank: every rank would train every run into the
    same folders."""
    if torchrun_env(environ) is not None:
        raise DistributedError(
            f"expected `python -m app {command}` outside torchrun, found RANK/WORLD_SIZE set; "
            f"run it as a plain process (each of its runs can use --jobs), or train one run "
            f"with `torchrun ... -m app train`")
