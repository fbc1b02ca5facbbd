"""Name -> object registries for datasets, models, partitions and methods."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from .errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """A dict of named entries, each with a one-line description.

    Lookups of unknown names raise UsageError naming every valid choice, which is the message the
    CLI shows the user.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, tuple[T, str]] = {}

    def register(self, name: str, description: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = (obj, description)
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name][0]
        except KeyError:
            raise UsageError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def describe(self) -> list[tuple[str, str]]:
        return [(n, self._entries[n][1]) for n in self.names()]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    @contextmanager
    def scope(self) -> Iterator[Registry[T]]:
        """Entries registered inside the `with` block are removed when it ends.

        For test-only entries: registered at import time they would stay for every later test, and
        what a registry-wide parametrization collects would depend on which test files were imported
        first.
        """
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)
