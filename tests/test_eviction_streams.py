"""Continuous eviction keeps up with any mix of new and returning IDs: against a NumPy
simulation of the policy applied exactly at every step, the table never evicts a row the
policy keeps, and holds at most 10% more rows than the policy would."""

import numpy as np
import pytest

import tfps
from tests.eviction_streams import burst_then_hot, run

POLICIES = {"ttl": lambda: tfps.eviction.TTL(steps=50),
            # A row seen once lives log(0.05) / log(0.95) = 58 steps.
            "decayed_frequency": lambda: tfps.eviction.DecayedFrequency(0.95, 0.05)}


# (share of new IDs, returning pool's drift per step): all new, mostly new, mixed, all
# returning (all hot), and a drifting pool whose IDs go out of use for good.
PATTERNS = [(1.0, 0), (0.99, 0), (0.9, 0), (0.5, 0), (0.0, 0), (0.2, 40)]


def checker(every, start):
    """An on_step callback that, every `every` steps from clock `start`, checks the table
    against the simulation and records (rows, rows the policy keeps)."""
    checked = []

    def check(table, simulation):
        if simulation.clock % every or simulation.clock < start:
            return
        # The table last swept in this step's lookup, at the clock before its apply.
        kept = simulation.kept(simulation.clock - 1)
        # Every row the policy keeps (clear of rounding) is still there...
        sure = simulation.kept(simulation.clock - 1, margin=1.01)
        assert table.find(sure, return_exists=True)[1].numpy().all(), "a row the policy keeps was evicted"
        # ...and the table holds at most 10% more rows than the policy would.
        rows = int(table.size())
        assert 0.99 * len(kept) <= rows <= 1.1 * len(kept) + 1, (simulation.clock, rows, len(kept))
        checked.append((rows, len(kept)))

    return check, checked


@pytest.mark.parametrize("new_fraction,drift", PATTERNS)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_rows_follow_the_policys_steady_state_for_any_share_of_new_ids(policy, new_fraction, drift):
    check, checked = checker(every=50, start=100)
    run(POLICIES[policy](), new_fraction, steps=400, keys_per_step=2000, on_step=check, drift=drift)
    assert len(checked) == 7
    if new_fraction == 1.0 and policy == "ttl":
        # The keys of the sweeping step and of the TTL + 1 steps before it (a row seen at
        # step s records s + 1 in its apply and expires when the clock passes s + 1 + TTL).
        assert checked[-1][1] == 2000 * (50 + 2)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_rows_of_a_burst_go_when_traffic_narrows_to_a_few_hot_ids(policy):
    """After a burst of IDs seen once, every step looks up the same 3 IDs, which reach
    few of the table's stripes: the burst's rows must still go as the policy says."""
    check, checked = checker(every=10, start=80)
    run(POLICIES[policy](), None, on_step=check, steps_keys=burst_then_hot(150, burst=20_000, hot=3))
    assert [kept for _, kept in checked] == [3] * 8


@pytest.mark.parametrize("new_fraction,drift", PATTERNS)
def test_min_count_admits_exactly_the_ids_seen_n_times_for_every_pattern(new_fraction, drift):
    # Exact counts (sketch_bytes=0): the rows are the IDs whose occurrences so far reached
    # 3, counted here in NumPy, whether IDs are all new, all hot, mixed or drifting.
    from tests.eviction_streams import stream
    table = tfps.DynamicTable(2, optimizer="sgd", admission=tfps.admission.MinCount(3, sketch_bytes=0))
    seen = {}
    for step, keys in enumerate(stream(120, 2000, new_fraction, seed=1, drift=drift)):
        table.find_or_insert(keys)
        unique, counts = np.unique(keys, return_counts=True)
        for key, count in zip(unique.tolist(), counts.tolist()):
            seen[key] = seen.get(key, 0) + count
        if step % 40 == 39:
            expected = np.sort(np.array([k for k, c in seen.items() if c >= 3], np.int64))
            rows = np.sort(table.export().keys.numpy())
            np.testing.assert_array_equal(rows, expected)
            stats = table.stats()
            assert stats["pending"] == sum(1 for c in seen.values() if c < 3)
    if new_fraction == 1.0:
        assert len(expected) == 0  # IDs seen once never get a row
