"""PMap against a plain dict (model-based), and its structural sharing."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from quorum.metadata.pmap import DELETE, MISSING, PMap, diff

# Small key space so keys collide, get deleted and re-added; hashes of ints
# are the ints, so big ints exercise deep branches and equal low bits.
keys = st.one_of(st.integers(0, 300), st.integers(-(2**70), 2**70), st.text(max_size=3))


class PMapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: dict = {}
        self.pmap: PMap = PMap()
        self.history: list[tuple[PMap, dict]] = []

    @rule(k=keys, v=st.integers())
    def set(self, k, v):
        self.history.append((self.pmap, dict(self.model)))
        self.pmap = self.pmap.set(k, v)
        self.model[k] = v

    @rule(k=keys)
    def remove(self, k):
        self.history.append((self.pmap, dict(self.model)))
        self.pmap = self.pmap.remove(k)
        self.model.pop(k, None)

    @rule(changes=st.dictionaries(keys, st.one_of(st.integers(), st.just(DELETE)), max_size=80))
    def bulk_update(self, changes):
        self.history.append((self.pmap, dict(self.model)))
        self.pmap = self.pmap.update(changes)
        for k, v in changes.items():
            if v is DELETE:
                self.model.pop(k, None)
            else:
                self.model[k] = v

    @rule(k=keys)
    def lookup(self, k):
        assert self.pmap.get(k, MISSING) == self.model.get(k, MISSING)
        assert (k in self.pmap) == (k in self.model)

    @invariant()
    def same_as_model(self):
        assert len(self.pmap) == len(self.model)
        assert dict(self.pmap.items()) == self.model
        assert self.pmap == PMap(self.model)

    @invariant()
    def old_versions_unchanged(self):
        # Persistence: earlier maps still hold exactly what they held.
        for old, snapshot in self.history[-3:]:
            assert dict(old.items()) == snapshot

    @invariant()
    def diff_matches_model(self):
        if not self.history:
            return
        old, before = self.history[-1]
        changed = {k: (a, b) for k, a, b in diff(old, self.pmap)}
        for k in before.keys() | self.model.keys():
            a, b = before.get(k, MISSING), self.model.get(k, MISSING)
            if a != b:
                assert k in changed, k
        for k, (a, b) in changed.items():
            assert a == before.get(k, MISSING) and b == self.model.get(k, MISSING)


TestPMapModel = PMapMachine.TestCase


def test_large_map_update_shares_untouched_subtrees():
    big = PMap((i, str(i)) for i in range(20_000))
    after = big.set(12_345, "changed")
    # Only the path to one leaf was copied: diff finds exactly one change
    # and never visits the other 19,999 entries' shared nodes.
    assert list(diff(big, after)) == [(12_345, "12345", "changed")]
    assert big[12_345] == "12345" and after[12_345] == "changed"
    assert len(after) == 20_000
    shared = sum(1 for a, b in zip(big._root, after._root) if a is b)
    assert shared == 31


def test_equality_and_mapping_protocol():
    m = PMap({"a": 1, "b": 2})
    assert m == {"a": 1, "b": 2}
    assert m != PMap({"a": 1})
    assert sorted(m) == ["a", "b"]
    assert m.remove("zzz") is m
    assert m.update({}) is m
