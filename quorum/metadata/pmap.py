"""A persistent (immutable) hash map with structural sharing.

Theory of operation
-------------------
`MetadataImage` must stay cheap to derive when a cluster holds tens of
thousands of partitions: applying a batch of N records may cost
O(N * changed), never O(image size). A plain dict would have to be copied
whole on every change; `PMap` is a hash array mapped trie instead.

* A node is either a *leaf* -- a plain dict of at most `_LEAF_MAX` entries
  -- or a *branch*: a tuple of 32 children (node or None) indexed by five
  bits of the key's hash, the next five bits at each level.
* An update copies only the path from the root to the touched leaves (a
  few 32-slot tuples and one small dict) and shares every other node with
  the old map. `update` applies many changes at once, copying each touched
  node once.
* Nodes are never mutated after construction; that is what makes sharing
  safe. `diff` uses it: identical subtrees (`is`) are skipped, so comparing
  an image with its successor costs O(changed), not O(size).
* Iteration order follows hash bits, then insertion order within a leaf. It
  is deterministic for int and UUID keys; sort when an order matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_BITS = 5
_MASK = (1 << _BITS) - 1
#: `get`'s default when `__getitem__` asks: no stored value is this object.
_ABSENT: Any = object()
_LEAF_MAX = 32
_MAX_SHIFT = 60  # Python hashes are 64 bits: past this, keys that collide stay in one leaf


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


DELETE: Any = _Sentinel("DELETE")
"""Value in `PMap.update` changes that removes the key."""

MISSING: Any = _Sentinel("MISSING")
"""Stands for an absent side in `diff`."""

_EMPTY: dict = {}


def _split(leaf: dict, shift: int) -> tuple:
    buckets: list[Any] = [None] * (1 << _BITS)
    for k, v in leaf.items():
        i = (hash(k) >> shift) & _MASK
        if buckets[i] is None:
            buckets[i] = {}
        buckets[i][k] = v
    for i, b in enumerate(buckets):
        if b is not None and len(b) > _LEAF_MAX and shift + _BITS <= _MAX_SHIFT:
            buckets[i] = _split(b, shift + _BITS)
    return tuple(buckets)


def _update(node: Any, shift: int, changes: list[tuple[int, Any, Any]]) -> tuple[Any, int]:
    """Apply (hash, key, value|DELETE) changes below `node`; return (new node, size delta)."""
    if type(node) is not tuple:
        leaf = dict(node) if node else {}
        delta = 0
        for _, k, v in changes:
            if v is DELETE:
                if k in leaf:
                    del leaf[k]
                    delta -= 1
            else:
                if k not in leaf:
                    delta += 1
                leaf[k] = v
        if len(leaf) > _LEAF_MAX and shift <= _MAX_SHIFT:
            return _split(leaf, shift), delta
        return (leaf or None), delta
    groups: dict[int, list[tuple[int, Any, Any]]] = {}
    for c in changes:
        groups.setdefault((c[0] >> shift) & _MASK, []).append(c)
    children = list(node)
    delta = 0
    for i, group in groups.items():
        children[i], d = _update(children[i], shift + _BITS, group)
        delta += d
    if all(c is None for c in children):
        return None, delta
    return tuple(children), delta


def _iter_items(node: Any) -> Iterator[tuple[Any, Any]]:
    if node is None:
        return
    if type(node) is not tuple:
        yield from node.items()
        return
    for child in node:
        if child is not None:
            yield from _iter_items(child)


def _as_dict(node: Any) -> dict:
    if node is None:
        return _EMPTY
    if type(node) is not tuple:
        return node
    return dict(_iter_items(node))


class PMap(Mapping[K, V], Generic[K, V]):
    """Immutable mapping; `set`, `remove` and `update` return new maps sharing structure."""

    __slots__ = ("_root", "_len")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] | None = None) -> None:
        self._root: Any = _EMPTY
        self._len = 0
        if items:
            pairs = items.items() if isinstance(items, Mapping) else items
            root, n = _update(_EMPTY, 0, [(hash(k), k, v) for k, v in pairs])
            self._root = _EMPTY if root is None else root
            self._len = n

    @classmethod
    def _make(cls, root: Any, length: int) -> PMap[K, V]:
        m = cls.__new__(cls)
        m._root = _EMPTY if root is None else root
        m._len = length
        return m

    def __getitem__(self, key: K) -> V:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def get(self, key: K, default: Any = None) -> Any:
        # The trie's one walk (`__getitem__` calls this): replaying a fence
        # looks a partition up once per record, and raising and catching a
        # KeyError for an absent key was a third of a lookup.
        node = self._root
        h = hash(key)
        shift = 0
        while type(node) is tuple:
            node = node[(h >> shift) & _MASK]
            if node is None:
                return default
            shift += _BITS
        return node.get(key, default)

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        for k, _ in _iter_items(self._root):
            yield k

    def items(self) -> Iterator[tuple[K, V]]:  # type: ignore[override]
        return _iter_items(self._root)

    def values(self) -> Iterator[V]:  # type: ignore[override]
        return (v for _, v in _iter_items(self._root))

    def update(self, changes: Mapping[K, Any]) -> PMap[K, V]:
        """A new map with every key of `changes` set, or removed where the value is `DELETE`."""
        if not changes:
            return self
        root, delta = _update(self._root, 0, [(hash(k), k, v) for k, v in changes.items()])
        return PMap._make(root, self._len + delta)

    def set(self, key: K, value: V) -> PMap[K, V]:
        return self.update({key: value})

    def remove(self, key: K) -> PMap[K, V]:
        """A new map without `key` (the same map if it is absent)."""
        return self.update({key: DELETE}) if key in self else self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PMap):
            if other._root is self._root:
                return True
            if other._len != self._len:
                return False
            return all(other.get(k, MISSING) == v for k, v in self.items())
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PMap({dict(self.items())!r})"


def diff(old: PMap[K, V], new: PMap[K, V]) -> Iterator[tuple[K, Any, Any]]:
    """Yield (key, old value or MISSING, new value or MISSING) for every key whose value differs.

    Values are compared by identity: shared subtrees are skipped without being
    visited, so the cost follows the number of changes, not the map size. A
    key set again to an equal but distinct object is reported.
    """
    yield from _diff(old._root, new._root)


def _diff(a: Any, b: Any) -> Iterator[tuple[Any, Any, Any]]:
    if a is b:
        return
    if type(a) is tuple and type(b) is tuple:
        for x, y in zip(a, b):
            if x is not y:
                yield from _diff(x, y)
        return
    da, db = _as_dict(a), _as_dict(b)
    for k, v in da.items():
        w = db.get(k, MISSING)
        if w is not v:
            yield k, v, w
    for k, w in db.items():
        if k not in da:
            yield k, MISSING, w
