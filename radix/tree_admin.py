"""TreeAdmin: cache administration on top of TreeEvict: evict_prefix, flush modes, pin / unpin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from radixd.radix.errors import FlushRefused, InvalidRequest, NotPinned, PinBudgetExceeded
from radixd.radix.lru import LruIndex
from radixd.radix.node import TOKEN_BYTES, Node, TokenKey, Tokens, as_tokens, common_prefix_len
from radixd.radix.pool import RC_MASK
from radixd.radix.tree_evict import TreeEvict

FlushMode = Literal["unlocked", "refuse", "force"]


class TreeAdmin(TreeEvict):
    """Administrative operations of :class:`radixd.radix.RadixTree` (use that class)."""

    # =============================================================== eviction
    def evict_prefix(self, tokens: Sequence[int] | bytes | TokenKey, namespace: str = "") -> int:
        """Drop every unlocked, unpinned cached sequence that starts with ``tokens``.

        An empty ``tokens`` means the whole namespace. Returns the number of blocks dropped.
        """
        root = self._roots.get(namespace)
        if root is None:
            return 0
        t = as_tokens(tokens)
        before = self._evicted["prefix"]
        for top in self._subtrees_with_prefix(root, t):
            self._evict_subtree(top, "prefix")
        return self._evicted["prefix"] - before

    def _subtrees_with_prefix(self, root: Node, t: Tokens) -> list[Node]:
        B = self._bb  # offsets in packed bytes
        node = root
        pos = 0
        n = len(t)
        while pos < n:
            rem = n - pos
            if rem >= B:
                child = node.children.get(t[pos : pos + B])
                if child is None:
                    return []
                L = len(child.tokens)
                if rem <= L:
                    return [child] if child.tokens[:rem] == t[pos:] else []
                if L % B or child.tokens != t[pos : pos + L]:
                    return []
                node = child
                pos += L
            else:
                by_first = node.by_first
                cands = by_first.get(t[pos : pos + TOKEN_BYTES], []) if by_first is not None else []
                return [c for c in cands if c.tokens[:rem] == t[pos:]]
        return list(node.children.values()) if node.parent is None else [node]

    def _evict_subtree(self, top: Node, reason: str) -> None:
        order: list[Node] = []
        stack = [top]
        while stack:
            x = stack.pop()
            if x.hold == 0:
                order.append(x)
                stack.extend(x.children.values())
            else:
                stack.extend(c for c in x.children.values())
        runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
        for x in reversed(order):  # children before their parents
            if x.alive and not x.children and x.hold == 0:
                self._remove_leaf(x, reason, None, pending=runs)
        if runs:
            self.pool._free_runs(runs)

    def flush(self, mode: FlushMode = "unlocked", include_pinned: bool = False) -> int:
        """Drop cached entries; returns the number of blocks the tree released.

        * ``"unlocked"``: evict everything not leased (and not pinned unless ``include_pinned``).
        * ``"refuse"``: like ``"unlocked"`` but raise FlushRefused (changing nothing) while any lease is
          held. (Waiting for idle is the engine's job: it retries once its requests have drained.)
        * ``"force"``: drop everything, leased and pinned included; outstanding leases become inert
          (releasing them later is a no-op). Blocks still held by tables stay allocated to them.
        """
        if mode not in ("unlocked", "refuse", "force"):
            raise InvalidRequest(f"flush mode must be 'unlocked', 'refuse' or 'force', got {mode!r}")
        if mode == "refuse" and self._leases:
            raise FlushRefused(
                f"flush refused: {self._leases} lease(s) still held; release them or flush('unlocked')"
            )
        before = self._cached_blocks
        if mode == "force":
            self._force_clear()
            return before
        if include_pinned:
            for ns, toks in list(self._pins):
                self.unpin(toks, ns)
        runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
        while (node := self._lru.pop_oldest()) is not None:
            self._remove_leaf(node, "flush", None, pending=runs)
        if runs:
            self.pool._free_runs(runs)
        return before - self._cached_blocks

    def _force_clear(self) -> None:
        pool = self.pool
        st = pool._state
        dropped = 0
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                x = stack.pop()
                stack.extend(x.children.values())
                if x.hold == 0:
                    pool._evictable -= x.n_solo
                for b in x.blocks:
                    st[b] = int(st[b]) & RC_MASK  # clear the owner first: no ownership hook
                    pool.decref(b)
                pool._unregister(x)
                dropped += len(x.blocks)
                x.alive = False
                x.in_lru = False
        self._evicted["flush"] += dropped
        self._roots.clear()
        self._lru = LruIndex()
        self._pins.clear()
        self._nodes = self._cached_blocks = self._pinned_blocks = self._leases = 0
        self._epoch += 1
        if self.listener is not None:
            self.listener.cleared()

    # ================================================================== pins
    def pin(self, tokens: Sequence[int] | bytes | TokenKey, namespace: str = "") -> int:
        """Exempt the cached prefix of ``tokens`` from eviction; returns the number of tokens pinned.

        Pins whole cached blocks (a partial trailing block only when it ends a cached leaf). Pinning
        the same tokens again is a no-op. Raises PinBudgetExceeded, changing nothing, when the newly
        pinned blocks would exceed the budget (``pin_budget_fraction`` of the pool).
        """
        t = as_tokens(tokens)
        key = (namespace, t)
        done = self._pins.get(key)
        if done is not None:
            return self._depth_tokens(done)
        root = self._roots.get(namespace)
        if root is None:
            return 0
        node = self._pin_target(root, t)
        if node is None:
            return 0
        add = 0
        x: Node | None = node
        while x is not None and x.parent is not None:
            if x.pin == 0:
                add += len(x.blocks)
            x = x.parent
        if self._pinned_blocks + add > self.pin_budget_blocks:
            raise PinBudgetExceeded(
                f"pinning {add} more blocks would exceed the pin budget: {self._pinned_blocks} of "
                f"{self.pin_budget_blocks} already pinned; unpin something or raise pin_budget_fraction"
            )
        pool = self.pool
        x = node
        while x is not None and x.parent is not None:
            x.pin += 1
            x.hold += 1
            if x.pin == 1:
                self._pinned_blocks += len(x.blocks)
            if x.hold == 1:
                pool._evictable -= x.n_solo
                self._lru.discard(x)
            x = x.parent
        self._pins[key] = node
        return self._depth_tokens(node)

    def _pin_target(self, root: Node, t: Tokens) -> Node | None:
        """Deepest node fully covered by ``t`` (splitting at a block boundary when ``t`` ends inside)."""
        B = self._bb  # offsets in packed bytes
        node = root
        pos = 0
        n = len(t)
        while pos < n:
            child = node.children.get(t[pos : pos + B]) if pos + B <= n else node.children.get(t[pos:])
            if child is None:
                break
            L = len(child.tokens)
            if t[pos : pos + L] == child.tokens:
                node = child
                pos += L
                if L % B:
                    break
                continue
            k = common_prefix_len(t, pos, child.tokens) // B
            if k >= 1:
                node = self._split(child, k)
            break
        return node if node.parent is not None else None

    def _depth_tokens(self, node: Node) -> int:
        total = 0
        x: Node | None = node
        while x is not None:
            total += len(x.tokens)
            x = x.parent
        return total // TOKEN_BYTES

    def unpin(self, tokens: Sequence[int] | bytes | TokenKey, namespace: str = "") -> int:
        """Undo :meth:`pin` of exactly these tokens; returns the tokens unpinned. Raises NotPinned."""
        key = (namespace, as_tokens(tokens))
        node = self._pins.pop(key, None)
        if node is None:
            raise NotPinned(
                f"no pin for these {len(key[1]) // TOKEN_BYTES} tokens in namespace {namespace!r}; "
                "unpin takes the same tokens that were pinned"
            )
        pool = self.pool
        x: Node | None = node
        while x is not None and x.parent is not None:
            x.pin -= 1
            x.hold -= 1
            if x.pin == 0:
                self._pinned_blocks -= len(x.blocks)
            if x.hold == 0:
                pool._evictable += x.n_solo
                if not x.children:
                    self._lru.add(x)
            x = x.parent
        return self._depth_tokens(node)
