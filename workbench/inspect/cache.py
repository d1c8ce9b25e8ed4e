"""A small least-recently-used cache for the pictures and predictions views compute."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LRUCache(Generic[V]):
    """At most ``size`` values by key; a hit makes a value the most recent, an insert drops the oldest.

    Examples:
        >>> cache = LRUCache(2)
        >>> cache.get(("step", 3), lambda: 3 ** 2)     # computed once, then served
        9
        >>> cache.get(("step", 3), lambda: 0)
        9
    """

    def __init__(self, size: int):
        self.size = size
        self._values: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value cached under ``key``, or ``compute()`` stored under it."""
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = compute()
        self._values[key] = value
        while len(self._values) > self.size:
            self._values.popitem(last=False)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        self._values.clear()


__all__ = ["LRUCache"]
