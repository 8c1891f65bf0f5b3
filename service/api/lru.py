"""A bounded, thread-safe map that drops its least recently used entry first: what a process remembers about
the sessions it served (``service.auth``'s verified session keys, ``service.sessions.gateway``'s known slots)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size, self._items, self._lock = size, OrderedDict[K, V](), threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> V:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def drop(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)
