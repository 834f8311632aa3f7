"""CatchUp's rule: which partitions count towards a restarted server's readiness, and when
each has reached the end offset seen at start (its state comes from the consumer)."""

from __future__ import annotations

from tierserve.ps.kafka_catchup import CatchUp

A, B, C = ("hps_et.m.t", 0), ("hps_et.m.t", 1), ("hps_et.other.t", 0)


def test_not_caught_up_until_the_end_offsets_are_known():
    catchup = CatchUp("c")
    assert catchup.status(lambda key: "local") == (False, "reading the end offsets of its topics")
    catchup.unknown(ConnectionError("all brokers down"))
    ok, why = catchup.status(lambda key: "local")
    assert not ok and "all brokers down" in why
    catchup.set_targets({})
    assert catchup.status(lambda key: "local") == (True, None)


def test_a_consumer_that_applies_nothing_needs_no_catching_up():
    assert CatchUp("c", needed=False).status(lambda key: "waiting") == (True, None)


def test_handled_offsets_count_once_the_partition_is_up_to_date_for_the_version():
    catchup = CatchUp("c")
    catchup.set_targets({A: 10, B: 5})
    states = {A: "waiting", B: "local"}
    catchup.handled.update({A: 10, B: 4})
    ok, why = catchup.status(states.get)
    assert not ok and "2 partitions short" in why  # A: its replay has not started
    states[A] = "local"
    ok, why = catchup.status(states.get)
    assert not ok and "1 partitions short" in why and "partition 1 at offset 4 of 5" in why
    catchup.handled[B] = 5
    assert catchup.status(states.get) == (True, None)


def test_a_model_not_served_does_not_count_until_it_is():
    catchup = CatchUp("c")
    catchup.set_targets({A: 3, C: 7})
    states = {A: "local", C: None}
    catchup.handled[A] = 3
    catchup.check(states.get)
    assert catchup.status(states.get) == (True, None)
    states[C] = "waiting"  # its model loaded: its replay must finish first
    assert not catchup.status(states.get)[0]
    states[C] = "local"
    catchup.handled[C] = 7
    assert catchup.status(states.get) == (True, None)


def test_reached_partitions_are_forgotten_so_later_lag_is_not_a_replay():
    catchup = CatchUp("c")
    catchup.set_targets({A: 3})
    catchup.handled[A] = 3
    catchup.check(lambda key: "local")
    assert catchup.targets == {}
    catchup.handled[A] = 0  # a rewind for a new version, later
    assert catchup.status(lambda key: "waiting") == (True, None)


def test_the_groups_committed_offsets_count_where_another_member_reads():
    catchup = CatchUp("c")
    catchup.set_targets({A: 8, B: 8})
    asked = []

    def read(keys):
        asked.extend(keys)
        return {key: 8 for key in keys}

    states = {A: "group", B: "local"}
    catchup.handled[B] = 8
    catchup.check(states.get, read)
    assert asked == [A]  # only where the group's offset counts
    assert catchup.status(states.get) == (True, None)
    catchup2 = CatchUp("c")
    catchup2.set_targets({A: 8})
    catchup2.committed[A] = 8
    assert not catchup2.status(lambda key: "local")[0]  # committed, but not by this process


def test_a_recreated_topic_drops_its_targets():
    catchup = CatchUp("c")
    catchup.set_targets({A: 100, B: 100, C: 1})
    catchup.handled.update({A: 100, C: 1})
    catchup.drop_topics({"hps_et.m.t"})
    assert catchup.targets == {C: 1} and A not in catchup.handled
    assert catchup.status(lambda key: "local") == (True, None)
