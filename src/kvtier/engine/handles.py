"""The engine's live handles: only the very object :class:`~kvtier.engine.Engine` issued completes.

A handle names slots the engine reserved (WRITING for a store, pinned for a load). If completion
trusted a field of the handle (its token), a copy carrying a live handle's token but other slots or
keys would complete in its place: the forged slots would be committed or unpinned and the real
ones left WRITING or pinned forever. So the book maps each token to the handle object it was given
to and completes a handle only when it is that object, of the expected kind. A handle of another
engine, a copy, a handle completed already or one of the wrong kind is a
:class:`~kvtier.errors.MisuseError` at the call and changes nothing.

All methods run under the engine's lock (the book has none of its own).
"""

from __future__ import annotations

from typing import TypeVar

from kvtier.engine.types import LoadHandle, StoreHandle
from kvtier.errors import MisuseError

__all__ = ["HandleBook"]

H = TypeVar("H", StoreHandle, LoadHandle)


class HandleBook:
    """Live handles by token (see the module doc)."""

    __slots__ = ("_last", "_live")

    def __init__(self) -> None:
        self._live: dict[int, StoreHandle | LoadHandle] = {}
        self._last = 0

    def __len__(self) -> int:
        return len(self._live)

    def issue(self, handle: H) -> H:
        """Register ``handle`` as live (its ``token`` is set here) and return it."""
        self._last += 1
        handle.token = self._last
        self._live[self._last] = handle
        return handle

    def redeem(self, where: str, handle: object, kind: type[StoreHandle] | type[LoadHandle]) -> None:
        """Retire ``handle`` if it is a live handle of this book of type ``kind``; else raise
        :class:`MisuseError` naming ``where`` and leave every live handle as it was."""
        token = getattr(handle, "token", None)
        if type(handle) is not kind or type(token) is not int or self._live.get(token) is not handle:
            raise MisuseError(
                f"{where}: handle already completed or not from this engine (a copy, or another "
                f"engine's); pass back the {kind.__name__} object this engine returned"
            )
        del self._live[token]
