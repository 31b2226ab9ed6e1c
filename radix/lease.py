"""Lease: a lock on one cached path of the radix tree, held by a request until it releases it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixd.radix.holds import Holds
    from radixd.radix.node import Node, Tokens


class Lease:
    """Locks a matched path against eviction until :meth:`release` (idempotent). An empty match's lease
    locks nothing yet; an insert with it locks the inserted path."""

    # NOTE: a live lease that locks a path holds one hold on every node of it (Holds.lease), counted
    # in Holds.num_leases; the lease's node stays alive and keeps its end while the lease lasts.

    __slots__ = ("_holds", "_namespace", "_node", "_open")

    def __init__(self, holds: Holds, node: Node | None, namespace: str) -> None:
        self._holds = holds
        self._node = node  # the end of the locked path (None: nothing locked yet)
        self._namespace = namespace  # the namespace of that path
        self._open = True

    @property
    def released(self) -> bool:
        """True once released."""
        return not self._open

    @property
    def locks_path(self) -> bool:
        """Whether the lease holds a path of cached nodes now (False for an empty match's lease until
        an insert gives it one, and after release)."""
        return self._node is not None

    def issued_by(self, holds: Holds) -> bool:
        return self._holds is holds

    def release(self) -> None:
        if self._open:
            self._open = False
            node = self._node
            if node is not None:
                self._node = None
                self._holds.unlease(node)

    def clone(self) -> Lease:
        """Another lease on the same path (e.g. one per forked sequence); released independently."""
        node = self._node
        if node is not None:
            self._holds.lease(node)
        # Without a path: a live empty lease, which a later insert can lock with.
        return Lease(self._holds, node, self._namespace)

    def follow(self, node: Node, namespace: str) -> None:
        """Move the lock onto ``node``'s path (an insert with this lease ended there); a released lease
        stays released."""
        if not self._open:
            return
        old = self._node
        if old is None:  # an empty match's lease starts locking here
            self._holds.lease(node)
        else:
            self._holds.move_lock(old, node)
        self._node = node
        self._namespace = namespace

    def resume_point(self, t: Tokens, cached: int, namespace: str) -> Node | None:
        """The locked path's end when it spells ``t``'s first ``cached`` bytes in ``namespace`` (an insert
        may start there), else None. NOTE: the lease keeps the path in place, so one edge compare suffices."""
        node = self._node
        if node is None or self._namespace != namespace or node.end != cached:
            return None
        return node if t.startswith(node.tokens, cached - bytes.__len__(node.tokens)) else None

    def __repr__(self) -> str:
        return f"Lease(released={self.released}, locks_path={self.locks_path})"
