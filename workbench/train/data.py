"""Data streams for the training loop: any iterable of dicts, or a dataset with seeded,
resumable shuffling; and :class:`DataFeed`, the run's data as the loop reads it.

A map-style dataset (``__len__`` + ``__getitem__``) gets a DataLoader whose order is a pure
function of ``(seed, epoch)``, and whose position is the number of batches consumed — so a run
resumed from a checkpoint reads exactly the batches the uninterrupted run would have read,
without re-reading the skipped ones. Any other iterable is read in order and, on resume,
fast-forwarded by the number of batches consumed (exact for deterministic iterables).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workbench.core.capabilities import CachesLatents
from workbench.errors import DataError

if TYPE_CHECKING:
    from workbench.core.composed import BaseHalf, ComposedModel
    from workbench.train.config import TrainingConfig
    from workbench.train.distributed import Distributed


class EpochSampler(Sampler):
    """Indices of one epoch, seeded by ``(seed, epoch)``, starting at ``start``."""

    def __init__(self, n: int, seed: int, epoch: int, start: int, shuffle: bool):
        self.n, self.seed, self.epoch, self.start, self.shuffle = n, seed, epoch, start, shuffle

    def order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g)

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start:].tolist())

    def __len__(self) -> int:
        return max(0, self.n - self.start)


class LatentCache(Dataset):
    """``dataset`` with each item's frozen-base work (``base.encode_item``) done once, on first use.

    Exact by construction: the base is frozen and deterministic, so an item's encoding never
    changes. Lives in the training process (``num_workers`` must be 0). ``base`` declares
    :class:`~workbench.core.capabilities.CachesLatents`.
    """

    def __init__(self, dataset: Dataset, base: Any):
        if not isinstance(base, CachesLatents):
            raise DataError(
                f"training.cache_latents: {type(base).__name__} does not declare CachesLatents, so it has no "
                f"frozen work to do ahead of training. Set cache_latents: false, or declare CachesLatents on "
                f"the backbone with its encode_item(item)."
            )
        self.dataset, self.base = dataset, base
        self._items: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        i = i + len(self) if i < 0 else i
        item = self._items.get(i)
        if item is None:
            item = self.base.encode_item(self.dataset[i])
            if item is None:
                raise DataError(
                    f"training.cache_latents: {type(self.base).__name__}.encode_item has nothing "
                    f"to precompute for items of {type(self.dataset).__name__} (it returned None). "
                    f"Set cache_latents: false, "
                    f"or give the items the key the backbone encodes (e.g. 'video')."
                )
            self._items[i] = item
        return item


def is_map_dataset(source: Any) -> bool:
    return isinstance(source, Dataset) and hasattr(source, "__len__") and not isinstance(source, DataLoader)


class DataStream:
    """Batches for the loop, with a position that can be saved, restored and rolled back."""

    def __init__(self, source: Any, *, batch_size: int = 4, seed: int = 0, shuffle: bool = True,
                 num_workers: int = 0, pin_memory: bool = False):
        if source is None:
            raise DataError("fit() needs data: a DataLoader / iterable of dicts, or a dataset (map-style). "
                            "Pass it as exp.fit(data, steps=N) or set a data: block in the config.")
        if (isinstance(source, (str, bytes, dict))
                or not isinstance(source, Iterable) and not is_map_dataset(source)):
            raise DataError(f"fit() data must be an iterable of batch dicts or a dataset, "
                            f"got {type(source).__name__}.")
        self.source = source
        self.map_style = is_map_dataset(source)
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.epoch = 0
        self.batches = 0  # consumed in the current epoch
        self._it: Iterator | None = None
        self._pending: list[Any] = []
        self._recent: list[Any] | None = None
        self.reiterable = self.map_style or not isinstance(source, Iterator)
        if self.map_style and len(source) < batch_size:
            raise DataError(f"The dataset has {len(source)} items, fewer than batch_size={batch_size}. "
                            f"Lower training.batch_size or add data.")

    # -- reading ----------------------------------------------------------------------------
    def _open(self) -> Iterator:
        if self.map_style:
            sampler = EpochSampler(len(self.source), self.seed, self.epoch, self.batches * self.batch_size,
                                   self.shuffle)
            loader = DataLoader(self.source, batch_size=self.batch_size, sampler=sampler, drop_last=True,
                                num_workers=self.num_workers, pin_memory=self.pin_memory,
                                persistent_workers=False,
                                # its own generator: opening a loader must not draw from the global RNG,
                                # which dropout inside the model uses (a resumed run reopens at another step)
                                generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
            return iter(loader)
        it = iter(self.source)
        for _ in range(self.batches):  # fast-forward to the saved position
            next(it)
        return it

    def next(self) -> Any:
        if self._pending:
            item, self.epoch, self.batches = self._pending.pop(0)
            if self._recent is not None:
                self._recent.append((item, self.epoch, self.batches))
            return item
        else:
            if self._it is None:
                self._it = self._open()
            try:
                item = next(self._it)
            except StopIteration:
                if not self.reiterable:
                    raise DataError(
                        f"The data iterator ran out after {self.batches} batches. "
                        f"Pass a re-iterable (a list, a DataLoader or a dataset) so epochs can repeat, "
                        f"or fewer steps."
                    ) from None
                if self.batches == 0:
                    raise DataError("The data yielded no batches at all.") from None
                self.epoch, self.batches = self.epoch + 1, 0
                self._it = self._open()
                try:
                    item = next(self._it)
                except StopIteration:
                    raise DataError("The data yielded no batches at all.") from None
        self.batches += 1
        if self._recent is not None:
            self._recent.append((item, self.epoch, self.batches))
        return item

    # -- positions --------------------------------------------------------------------------
    def mark(self) -> tuple[int, int]:
        """Start remembering consumed batches so a partial step can be undone."""
        self._recent = []
        return self.epoch, self.batches

    def rollback(self, mark: tuple[int, int]) -> None:
        """Undo the batches consumed since ``mark``: they are served again, in order."""
        if self._recent:
            self._pending = list(self._recent) + self._pending
        self.epoch, self.batches = mark
        self._recent = None

    def commit(self) -> None:
        self._recent = None

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self._it, self._pending = None, []

    # -- work done ahead --------------------------------------------------------------------
    def base_half(self, step: int, micro: int) -> BaseHalf | None:
        """The frozen base's half of the training step for the batch last served, when the stream
        carries it computed ahead (:class:`~workbench.train.ahead.AheadStream`); ``None``: the loop
        computes it, drawing micro-batch ``micro`` of step ``step``'s noise itself."""
        return None


class ShardedStream(DataStream):
    """Rank ``rank`` of ``world``'s share of a map-style dataset, ``per_rank`` micro-batches a step.

    Each optimizer step covers the next ``world × per_rank`` micro-batches of the one seeded
    order (exactly those a single process with ``grad_accum = world × per_rank`` reads); rank ``r``
    reads the ``r``-th run of ``per_rank`` of them and never loads the others. The position is
    counted in micro-batches of that one order, so it means the same at any world size: a run
    stopped on two ranks continues on one, and the reverse.
    """

    def __init__(self, source: Any, *, rank: int, world: int, per_rank: int, **kwargs):
        super().__init__(source, **kwargs)
        if not self.map_style:
            raise DataError(f"A distributed run reads a map-style dataset (__len__ and __getitem__), "
                            f"so each rank can load only its own items; got {type(source).__name__}. "
                            f"Wrap the data in a Dataset, or give the config a data: block.")
        self.rank, self.world, self.per_rank = rank, world, per_rank
        self._served = 0  # own micro-batches served in the current step
        self._step_start = (self.epoch, self.batches)

    def _advance(self, position: tuple[int, int], count: int) -> tuple[int, int]:
        epoch, k = position
        per_epoch = len(self.source) // self.batch_size
        k += count
        return epoch + k // per_epoch, k % per_epoch

    def _plan(self) -> Iterator[list[int]]:
        """Own index lists from the current position on, across epochs (never ends)."""
        epoch, k = self.epoch, self.batches
        per_epoch = len(self.source) // self.batch_size
        block, first = self.world * self.per_rank, self.rank * self.per_rank
        order = EpochSampler(len(self.source), self.seed, epoch, 0, self.shuffle).order()
        slot = 0
        while True:
            if k >= per_epoch:
                epoch, k = epoch + 1, 0
                order = EpochSampler(len(self.source), self.seed, epoch, 0, self.shuffle).order()
            if first <= slot < first + self.per_rank:
                yield order[k * self.batch_size:(k + 1) * self.batch_size].tolist()
            k, slot = k + 1, (slot + 1) % block

    def _open(self) -> Iterator:
        self._step_start, self._served = (self.epoch, self.batches), 0
        loader = DataLoader(self.source, batch_sampler=_Plan(self._plan), num_workers=self.num_workers,
                            pin_memory=self.pin_memory, persistent_workers=False)
        return iter(loader)

    def next(self) -> Any:
        if self._pending:  # served again after a rollback, with the positions it had
            item = super().next()
        else:
            if self._it is None:
                self._it = self._open()
            item = next(self._it)
            if self._served + 1 == self.per_rank:  # the step's block is done, on every rank
                self.epoch, self.batches = self._advance(self._step_start, self.world * self.per_rank)
            if self._recent is not None:
                self._recent.append((item, self.epoch, self.batches))
        self._served += 1
        if self._served == self.per_rank:
            self._step_start, self._served = (self.epoch, self.batches), 0
        return item

    def rollback(self, mark: tuple[int, int]) -> None:
        super().rollback(mark)
        self._served = 0
        self._step_start = mark


class _Plan:
    """A batch sampler over a generator of index lists (DataLoader wants an iterable object)."""

    def __init__(self, make: Any):
        self.make = make

    def __iter__(self) -> Iterator[list[int]]:
        return self.make()


class DataFeed:
    """A run's data as its loop reads it, and how far the loop has read.

    The data given to ``fit`` (or, without any, the config's ``data:`` block, or the
    ``training.cache_latents: DIR`` cache) is read through the latent cache
    ``training.cache_latents`` asks for, as a :class:`DataStream` seeded by the run (a
    :class:`ShardedStream` of this rank's micro-batches under ``torchrun``). A later ``fit`` with
    the same data, or none, continues the same stream; a checkpoint records its :meth:`position`,
    and :meth:`restore` positions the next stream made there.

    ``data_block``: the config's ``data:`` block (``None`` for an experiment built in Python);
    ``dist``: the run's :class:`~workbench.train.distributed.Distributed` (``None`` on one
    process) and ``micro``: this process's micro-batches of a step.
    """

    def __init__(self, training: TrainingConfig, model: ComposedModel, *, data_block: dict | None = None,
                 dist: Distributed | None = None, micro: int = 1, device: torch.device | None = None):
        self.training, self.model, self.data_block = training, model, data_block
        self.dist, self.micro = dist, micro
        self.pin_memory = device is not None and torch.device(device).type == "cuda"
        #: The stream the loop reads (``None`` until the first :meth:`stream`, and after :meth:`restore`).
        self.current: DataStream | None = None
        self._position: dict | None = None  # where the next stream made starts (a restored run's)
        self._caches: list[tuple[Any, LatentCache]] = []
        self._disk = None  # the training.cache_latents: DIR dataset, opened on first use

    def default(self) -> Any:
        """The dataset of the config's ``data:`` block, built afresh (``None`` without one)."""
        if self.data_block is None:
            return None
        from workbench.config import build

        block = self.data_block
        return build("dataset", block["type"], block.get("config"), where="data")

    def cached(self, data: Any) -> Any:
        """``data`` behind its in-process latent cache when ``training.cache_latents: true``
        (one cache per dataset, kept for the experiment's life)."""
        if self.training.cache_latents is not True or not is_map_dataset(data):
            return data
        for source, cache in self._caches:
            if source is data:
                return cache
        cache = LatentCache(data, self.model.base)
        self._caches.append((data, cache))
        return cache

    def _disk_cache(self, data: Any) -> Any:
        """The training data read from the ``training.cache_latents: DIR`` cache
        (checked against this run)."""
        from workbench.train.latent_store import DiskLatentCache, cache_identity

        root = self.training.cache_latents
        if self._disk is None:
            cache = DiskLatentCache(root)
            cache.require(cache_identity(self.model.base, self.data_block, len(cache)))
            self._disk = cache
        if data is not None and is_map_dataset(data) and len(data) != len(self._disk):
            raise DataError(f"training.cache_latents: {root} caches {len(self._disk)} items "
                            f"but the data passed to fit() has {len(data)}. "
                            f"Fit without data to train from the cache, or rebuild it.")
        return self._disk

    def stream(self, data: Any = None) -> DataStream:
        """The stream ``fit(data)`` reads: ``data`` itself if it is a :class:`DataStream` (one
        made for this run, e.g. :meth:`~workbench.train.ahead.BaseAhead.stream`); the current one
        when ``data`` is ``None`` or the data it reads; else a new one over ``data`` (or the
        default data)."""
        if isinstance(data, DataStream):
            self.current = data
            return data
        if data is None:
            if self.current is not None:
                return self.current
            data = None if isinstance(self.training.cache_latents, str) else self.default()
        check = getattr(data, "check_conditions", None)
        adapter = self.model.adapter
        if callable(check):  # a dataset that knows its signal widths checks them against the adapter's
            check(adapter.consumes, owner=f"the adapter ({type(adapter).__name__})")
        data = self._disk_cache(data) if isinstance(self.training.cache_latents, str) else self.cached(data)
        if self.current is not None and self.current.source is data:
            return self.current
        t = self.training
        options = dict(batch_size=t.batch_size, seed=t.seed, shuffle=t.shuffle, num_workers=t.num_workers,
                       pin_memory=self.pin_memory)
        if self.dist is None:
            stream = DataStream(data, **options)
        else:
            stream = ShardedStream(data, rank=self.dist.rank, world=self.dist.world_size,
                                   per_rank=self.micro, **options)
        if self._position is not None:
            stream.load_state_dict(self._position)
            self._position = None
        self.current = stream
        return stream

    def position(self) -> dict | None:
        """Where the loop stands in the data (a checkpoint's ``data``): the current stream's
        position, or the restored one no stream has started from yet."""
        if self.current is not None:
            return self.current.state_dict()
        return dict(self._position) if self._position is not None else None

    def restore(self, position: dict | None) -> None:
        """Start the next stream made at ``position`` (a checkpoint's), dropping the current one."""
        self.current = None
        self._position = position


__all__ = ["DataFeed", "DataStream", "EpochSampler", "LatentCache", "ShardedStream", "is_map_dataset"]
