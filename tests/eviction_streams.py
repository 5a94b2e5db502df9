"""Streams of IDs as users bring them (all new, mostly new, mixed, all returning) through a
table that evicts, beside a NumPy simulation of the policy applied exactly at every step.
Shared by tests/test_eviction_streams.py and benchmarks/eviction_pace.py."""

import numpy as np

import tfps

RETURNING = 5000  # the pool returning IDs are drawn from


def stream(steps, keys_per_step, new_fraction, seed=0, drift=0):
    """Yields each step's keys: `new_fraction` of them never seen before, the rest drawn
    from a pool of RETURNING IDs, which slides on by `drift` IDs a step (old IDs stop
    returning, as popular items go out of fashion)."""
    rng = np.random.default_rng(seed)
    fresh = 1 << 40
    for step in range(steps):
        new = int(round(keys_per_step * new_fraction))
        pool_start = step * drift
        keys = np.concatenate([np.arange(fresh, fresh + new, dtype=np.int64),
                               rng.integers(pool_start, pool_start + RETURNING, keys_per_step - new).astype(np.int64)])
        fresh += new
        yield keys


def burst_then_hot(steps, burst, hot):
    """Yields each step's keys: `burst` IDs seen once at the first step (yesterday's
    catalogue, a crawler), then the same `hot` IDs every step after."""
    yield np.arange(1 << 40, (1 << 40) + burst, dtype=np.int64)
    for _ in range(steps - 1):
        yield np.arange(hot, dtype=np.int64)


class Simulation:
    """The policy applied exactly: after each step, the rows it keeps. A step is a training
    lookup at clock c (each occurrence counts; the row is seen at c), then an apply that
    moves the clock to c + 1 and records c + 1 as the row's last step (a score decays up
    to it first)."""

    def __init__(self, policy):
        self.policy = policy
        self.last, self.score = {}, {}
        self.clock = 0

    def step(self, keys):
        unique, counts = np.unique(keys, return_counts=True)
        decay = getattr(self.policy, "decay", 1.0)
        threshold = getattr(self.policy, "threshold", 0.0)
        for key, count in zip(unique.tolist(), counts.tolist()):
            score = self.score.get(key, 0.0) * decay ** (self.clock - self.last.get(key, self.clock))
            if score < threshold:  # it went when it fell under: it comes back anew
                score = 0.0
            self.score[key] = (score + count) * decay  # decayed on to the apply's step
            self.last[key] = self.clock + 1
        self.clock += 1

    def kept(self, clock, margin=1.0):
        """Keys the policy keeps at `clock`; with margin > 1, only those kept by that
        factor (a score that far above the threshold, an age that far under the TTL),
        clear of rounding."""
        keys = np.fromiter(self.last, np.int64, len(self.last))
        last = np.fromiter(self.last.values(), np.int64, len(self.last))
        if isinstance(self.policy, tfps.eviction.TTL):
            return keys[clock - last <= self.policy.steps / margin]
        score = np.fromiter(self.score.values(), np.float64, len(self.score))
        decayed = score * self.policy.decay ** np.maximum(0, clock - last)
        return keys[decayed >= self.policy.threshold * margin]


def run(policy, new_fraction, steps=400, keys_per_step=2000, seed=0, on_step=None, drift=0,
        steps_keys=None):
    """Trains a table (and the simulation) on the stream (or on `steps_keys`, one array of
    keys per step); returns (table, simulation, rows after each step)."""
    table = tfps.DynamicTable(2, optimizer="sgd", eviction=policy)
    simulation = Simulation(policy)
    rows = []
    if steps_keys is None:
        steps_keys = stream(steps, keys_per_step, new_fraction, seed, drift)
    for keys in steps_keys:
        unique = np.unique(keys)
        table.find_or_insert(keys)
        table.apply_gradients(unique, np.zeros((len(unique), 2), np.float32), step=-1)
        simulation.step(keys)
        rows.append(int(table.size()))
        if on_step is not None:
            on_step(table, simulation)
    return table, simulation, rows
