"""Random broker lives and admin actions against the controller; invariants after every step.

Brokers register, heartbeat, fall silent, ask to be fenced, shut down and
restart; leaders shrink and expand ISRs; admins create and delete topics and
elect leaders; time passes and the controller ticks. After every step the
image must satisfy what brokers and clients rely on.
"""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.delete_topics.v6 import request as dt_req
from kio.schema.elect_leaders.v2 import request as el_req
from kio.schema.errors import ErrorCode

from controller_testing import Cluster
from quorum.metadata import image_from_records, image_to_records

BROKERS = range(1, 6)


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster()
        self.alive: set[int] = set()  # processes that are running and heartbeating
        self.epochs: dict[tuple, tuple[int, int]] = {}
        self.topic_count = 0

    @rule(b=st.sampled_from(BROKERS))
    def start(self, b):
        if b in self.alive:
            return
        r = self.c.register(b)
        if r.error_code == ErrorCode.none:
            self.alive.add(b)
            self.c.heartbeat(b)

    @rule(b=st.sampled_from(BROKERS))
    def crash(self, b):
        self.alive.discard(b)

    @rule(b=st.sampled_from(BROKERS))
    def controlled_shutdown(self, b):
        if b not in self.alive:
            return
        for _ in range(3):
            r = self.c.heartbeat(b, want_shut_down=True)
            if r.should_shut_down:
                self.alive.discard(b)
                return

    @rule(b=st.sampled_from(BROKERS), fence=st.booleans())
    def heartbeat(self, b, fence):
        if b in self.alive:
            self.c.heartbeat(b, want_fence=fence)

    @rule(ms=st.integers(100, 6000))
    def time_passes(self, ms):
        self.c.now_ms += ms
        for b in self.alive:
            self.c.heartbeat(b)
        self.c.tick(self.c.now_ms)

    @rule(ms=st.integers(1000, 12000))
    def clock_jumps(self, ms):
        # Time passes but the controller has not ticked yet: a restarted
        # broker may re-register while its old registration still looks live.
        self.c.now_ms += ms

    @rule(ms=st.integers(5000, 12000))
    def long_pause(self, ms):
        # Nobody heartbeats: sessions may expire.
        self.c.tick(self.c.now_ms + ms)

    @rule(partitions=st.integers(1, 6), rf=st.integers(1, 3), unclean=st.booleans())
    def create_topic(self, partitions, rf, unclean):
        configs = {"unclean.leader.election.enable": "true"} if unclean else {}
        r = self.c.create_topic(f"t{self.topic_count}", partitions=partitions, rf=rf, configs=configs)
        usable = len(self.c.image.usable_brokers())
        assert (r.error_code == ErrorCode.none) == (rf <= usable), (r, usable)
        self.topic_count += 1

    @precondition(lambda self: len(self.c.image.topics_by_id) > 0)
    @rule(data=st.data())
    def delete_topic(self, data):
        name = data.draw(st.sampled_from(sorted(self.c.image.topic_ids_by_name)))
        self.c.send(dt_req.DeleteTopicsRequest(topics=(dt_req.DeleteTopicState(name=name, topic_id=None),), timeout=0))

    @precondition(lambda self: len(self.c.image.topics_by_id) > 0)
    @rule(data=st.data())
    def leader_changes_isr(self, data):
        name = data.draw(st.sampled_from(sorted(self.c.image.topic_ids_by_name)))
        topic = self.c.image.topic(name)
        index = data.draw(st.sampled_from(sorted(topic.partitions)))
        p = topic.partitions[index]
        if p.leader == -1 or p.leader not in self.alive:
            return
        others = [b for b in p.replicas if b != p.leader]
        isr = [p.leader] + [b for b in others if data.draw(st.booleans())]
        r = self.c.alter_isr(name, index, isr)
        error = r.topics[0].partitions[0].error_code if r.topics else r.error_code
        eligible = all(self.c.image.is_usable(b) for b in isr)
        assert error == (ErrorCode.none if eligible else ErrorCode.ineligible_replica), (error, isr)
        if eligible:
            assert self.c.partition(name, index).isr == tuple(isr)

    @rule(election=st.sampled_from([0, 1]))
    def elect_everything(self, election):
        self.c.send(el_req.ElectLeadersRequest(election_type=election, topic_partitions=None))

    @invariant()
    def partitions_are_well_formed(self):
        image = self.c.image
        for topic in image.topics_by_id.values():
            for index, p in topic.partitions.items():
                assert p.isr and set(p.isr) <= set(p.replicas)
                assert p.leader == -1 or p.leader in p.isr
                # Leaders are live: the controller moved leadership off every fenced broker.
                assert p.leader == -1 or image.is_usable(p.leader), (topic.name, index, p)
                # Non-live brokers have left every ISR, unless they are its last member.
                dead = [b for b in p.isr if not image.is_usable(b)]
                assert not dead or len(p.isr) == 1, (topic.name, index, p)
                # An offline partition has no live in-sync replica to elect.
                if p.leader == -1:
                    assert not any(image.is_usable(b) for b in p.isr), (topic.name, index, p)

    @invariant()
    def epochs_only_grow(self):
        for topic in self.c.image.topics_by_id.values():
            for index, p in topic.partitions.items():
                key = (topic.topic_id, index)
                if key in self.epochs:
                    leader_epoch, partition_epoch = self.epochs[key]
                    assert p.leader_epoch >= leader_epoch and p.partition_epoch >= partition_epoch
                self.epochs[key] = (p.leader_epoch, p.partition_epoch)

    @invariant()
    def snapshot_round_trips(self):
        image = self.c.image
        assert image_from_records(image_to_records(image), image.offset, image.epoch) == image


TestControllerModel = ControllerMachine.TestCase
