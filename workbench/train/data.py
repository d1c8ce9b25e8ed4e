"""Data streams for the training loop: any iterable of dicts, or a dataset with seeded,
resumable shuffling.

A map-style dataset (``__len__`` + ``__getitem__``) gets a DataLoader whose order is a pure
function of ``(seed, epoch)``, and whose position is the number of batches consumed — so a run
resumed from a checkpoint reads exactly the batches the uninterrupted run would have read,
without re-reading the skipped ones. Any other iterable is read in order and, on resume,
fast-forwarded by the number of batches consumed (exact for deterministic iterables).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workbench.core.capabilities import CachesLatents
from workbench.errors import DataError


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
