"""Scale-out on torch.distributed: the same experiment on K processes, with the same result.

    torchrun --nproc_per_node=K -m workbench train CONFIG
    torchrun --nnodes=N --node_rank=I --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT \\
             --nproc_per_node=K -m workbench train CONFIG

Each rank reads its own micro-batches of every step (the ones a single process with
``grad_accum`` × K would read, in order; see :class:`~workbench.train.data.ShardedStream`), draws
its noise from the step and the micro-batch's place in the step (never from the rank), and
accumulates gradients locally. Once per optimizer step the trainable parameters' gradients are
averaged in one flat all-reduce: that is data-parallel training of the trainable parts only — the
frozen base is never broadcast, all-reduced or held by an optimizer. (A ``DistributedDataParallel``
wrapper would have to wrap the module whose forward produces the gradients; for adapters inside the
base, LoRA or ControlNet, that is the base itself, which DDP would then broadcast.)

With ``strategy: fsdp`` and ``shard_base: true`` the frozen base is sharded with FSDP2
(``fully_shard``) over the ranks, block by block: each rank holds 1/K of its weights and gathers a
block's weights only while that block runs.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
from torch import nn

from workbench.config import check
from workbench.errors import WorkbenchError


class DistributedError(WorkbenchError, RuntimeError):
    """A distributed run could not start, or lost a rank."""


@dataclass
class DistributedConfig:
    """``training.distributed``: used when the run is launched on several processes (``torchrun``).

    ``strategy``: ``ddp`` (every rank holds the whole frozen base) or ``fsdp`` (FSDP2).
    ``shard_base``: with ``fsdp``, shard the frozen base's weights across the ranks.
    ``backend``: ``auto`` picks ``nccl`` on CUDA and ``gloo`` on the CPU. ``timeout_s``: how long a
    rank waits for the others in a collective before the run fails (a rank that died).
    """

    strategy: Literal["ddp", "fsdp"] = "ddp"
    shard_base: bool = False
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    timeout_s: float = 600.0

    def __post_init__(self):
        check(not (self.shard_base and self.strategy != "fsdp"), "shard_base",
              f"sharding the base needs strategy: fsdp, got strategy: {self.strategy}. "
              f"Set strategy: fsdp, or shard_base: false.")
        check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}.")


def launched_world_size() -> int:
    """The number of processes this run was launched with (``WORLD_SIZE``; 1 without a launcher)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as err:
        raise DistributedError(f"WORLD_SIZE must be an integer, got {os.environ['WORLD_SIZE']!r}.") from err


def launched_rank() -> int:
    """This process's rank in a launched run (``RANK``; 0 without a launcher), known before the process
    group is joined: only rank 0 writes the run's files."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError as err:
        raise DistributedError(f"RANK must be an integer, got {os.environ['RANK']!r}.") from err


def init_process_group(backend: str, timeout: timedelta | None = None) -> None:
    """``torch.distributed.init_process_group``, after importing the torch modules that would
    otherwise keep the group alive past ``destroy_process_group``.

    ``torch.distributed.nn.functional`` takes ``group.WORLD`` as its functions' default argument
    when it is first imported; imported after the group exists (building an optimizer or importing
    the compiler imports it), it holds that group for the life of the process. The group's gloo
    threads then outlive ``destroy_process_group`` and are torn down during interpreter
    finalisation, where a rank was seen to abort (SIGABRT, "terminate called without an active
    exception") after its run had finished and saved. Imported first, its defaults are ``None``.
    """
    import torch.distributed.nn.functional  # noqa: F401  (see above: before the group exists)

    kwargs = {} if timeout is None else {"timeout": timeout}
    torch.distributed.init_process_group(backend, **kwargs)


def local_device(device: torch.device) -> torch.device:
    """``device`` as this process's own: ``cuda:LOCAL_RANK`` for a CUDA run under a launcher."""
    if device.type == "cuda" and launched_world_size() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _backend(config: DistributedConfig, device: torch.device) -> str:
    backend = config.backend
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise DistributedError(f"training.distributed.backend: 'nccl' cannot run on device {device.type!r}: "
                               f"NCCL only moves CUDA tensors. "
                               f"Use backend: gloo (or auto) for a {device.type} run, "
                               f"or training.device: cuda.")
    if backend == "nccl" and not torch.distributed.is_nccl_available():
        raise DistributedError("training.distributed.backend: 'nccl' is not available in this PyTorch build. "
                               "Use backend: gloo (or auto).")
    return backend


class Distributed:
    """This process's place in a distributed run, and the few collectives the trainer needs."""

    def __init__(self, rank: int, world_size: int, device: torch.device, config: DistributedConfig,
                 owns_group: bool):
        self.rank, self.world_size, self.device, self.config = rank, world_size, device, config
        self._owns_group = owns_group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls, config: DistributedConfig, device: torch.device) -> Distributed | None:
        """Join the run's process group (``None`` for a single-process run).

        ``device`` is the one the run asked for; on CUDA each rank takes ``cuda:LOCAL_RANK``.
        """
        dist = torch.distributed
        world = launched_world_size()
        if world <= 1 and not (dist.is_available() and dist.is_initialized()):
            return None
        if not dist.is_available():
            raise DistributedError("This PyTorch build has no torch.distributed; run on one process.")
        device = local_device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        owns = False
        if not dist.is_initialized():
            missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK") if not os.environ.get(k)]
            if missing:
                raise DistributedError(
                    f"WORLD_SIZE={world} asks for a distributed run, but {', '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not set. "
                    f"Launch with `torchrun --nproc_per_node={world} -m workbench train CONFIG` "
                    f"(it sets them all), or set MASTER_ADDR (the host of rank 0), "
                    f"MASTER_PORT (a free port there) and RANK (0..{world - 1}) for every process.")
            try:
                init_process_group(_backend(config, device), timedelta(seconds=config.timeout_s))
            except DistributedError:
                raise
            except Exception as err:
                raise DistributedError(
                    f"Could not join the process group at "
                    f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                    f"as rank {os.environ['RANK']} of {world}: {type(err).__name__}: {err}. "
                    f"Check that every rank uses the same MASTER_ADDR / MASTER_PORT "
                    f"and that the port is reachable.") from err
            owns = True
        return cls(dist.get_rank(), dist.get_world_size(), device, config, owns)

    def split_micro_batches(self, grad_accum: int) -> int:
        """This rank's share of a step's ``grad_accum`` micro-batches (the same on every rank)."""
        if grad_accum % self.world_size:
            from workbench.errors import ConfigError

            fits = [k * self.world_size for k in range(1, 4)]
            raise ConfigError(
                f"training.grad_accum: {grad_accum} micro-batches per step cannot be split evenly over "
                f"{self.world_size} ranks. grad_accum counts a step's micro-batches over all ranks "
                f"(so a config means the same run at any world size); "
                f"use a multiple of {self.world_size}, e.g. "
                f"{', '.join(map(str, fits))} (on the command line: workbench train CONFIG --grad-accum "
                f"{fits[0]}), or launch {', '.join(str(d) for d in _divisors(grad_accum))} ranks.")
        return grad_accum // self.world_size

    # -- collectives -------------------------------------------------------------------------
    def _collective(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            raise DistributedError(
                f"Rank {self.rank} of {self.world_size}: the collective '{what}' failed "
                f"({type(err).__name__}: {err}). "
                f"Another rank has probably died or timed out (its own log says why). "
                f"Checkpoints are written whole by rank 0 only, "
                f"so the last one in the run directory is intact: "
                f"resume from it with `workbench train CONFIG --resume`.") from err

    def agree_on_config(self, config: dict[str, Any]) -> None:
        """Refuse to start when the ranks were given different configs, naming the first difference."""
        mine = json.dumps(config, sort_keys=True, default=str)
        gathered: list[Any] = [None] * self.world_size
        self._collective("config check", torch.distributed.all_gather_object, gathered, mine)
        reference = json.loads(gathered[0])
        for rank, text in enumerate(gathered):
            if text != gathered[0]:
                where = _first_difference(reference, json.loads(text))
                raise DistributedError(
                    f"Rank {rank} was started with a different config from rank 0 ({where}). "
                    f"Every rank must run the same config: "
                    f"launch them all from the same file with the same command-line options.")

    def broadcast_(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's values into every rank's ``tensors`` (in place)."""
        for t in tensors:
            self._collective("broadcast", torch.distributed.broadcast, t.data, 0)

    def average_gradients_(self, params: list[nn.Parameter]) -> None:
        """Every rank's gradients replaced by their mean over the ranks: one flat all-reduce."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._collective("gradient all-reduce", torch.distributed.all_reduce, flat)
        flat.div_(self.world_size)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone() if p.grad is None else p.grad.copy_(
                flat[offset:offset + n].view_as(p))
            offset += n

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` averaged over the ranks (in place)."""
        self._collective("mean", torch.distributed.all_reduce, tensor)
        return tensor.div_(self.world_size)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        self._collective("sum", torch.distributed.all_reduce, tensor)
        return tensor

    def barrier(self) -> None:
        self._collective("barrier", torch.distributed.barrier)

    def close(self) -> None:
        """Leave the process group, together: a rank that tore its group down while another still
        wrote its checkpoint was seen to abort at exit (gloo), so every rank waits for the others.

        The group's threads stop only when the last reference to it goes. Besides the model's
        sharded parameters (gone with the experiment), DTensor's sharding-propagation caches keep
        the device mesh, and with it the group, for the life of the process; they are cleared here
        so that the threads do not outlive the interpreter (see :func:`init_process_group`).
        """
        if self._owns_group and torch.distributed.is_initialized():
            self.barrier()
            torch.distributed.destroy_process_group()
            self._owns_group = False
            _clear_sharding_caches()


def _clear_sharding_caches() -> None:
    """Empty DTensor's sharding-propagation caches (they hold device meshes), if DTensor was used."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor import DTensor

    # private in torch (debug.py clears them the same way): looked up, so another version only skips them
    propagator = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    clear_python = getattr(getattr(propagator, "propagate_op_sharding", None), "cache_clear", None)
    clear_fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    for clear in (clear_python, clear_fast_path):
        if clear is not None:
            clear()


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
    return f"{path or 'config'}: rank 0 has {a!r}, this rank has {b!r}"


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The modules FSDP shards, innermost first: the blocks of the outermost ``ModuleList``s, then
    every other module that owns parameters itself.

    FSDP2 gathers a unit's weights in its ``__call__``; a backbone calls its parts through methods
    of its own (``encode``, ``denoise``), never through one root ``forward``, so every parameter must
    belong to a unit that is itself called as a module.
    """
    blocks: list[nn.Module] = []
    owners: list[nn.Module] = []

    def owns(m: nn.Module) -> bool:
        return any(True for _ in m.parameters(recurse=False))

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, nn.ModuleList) and any(True for _ in child.parameters()):
                blocks.extend(c for c in child if any(True for _ in c.parameters()))
            else:
                visit(child)
                if owns(child):
                    owners.append(child)

    visit(module)
    return blocks + owners


def shard_base(base: nn.Module, dist: Distributed) -> None:
    """Shard the frozen ``base`` in place with FSDP2 over all ranks (see :func:`shard_units`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if any(True for _ in base.parameters(recurse=False)):
        names = [n for n, _ in base.named_parameters(recurse=False)]
        raise DistributedError(
            f"training.distributed.shard_base: {type(base).__name__} holds parameters directly "
            f"({', '.join(names[:3])}), which FSDP can only gather in its forward, and backbones are called "
            f"through their own methods. Move them into a submodule, or set shard_base: false.")
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    for unit in shard_units(base):
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
