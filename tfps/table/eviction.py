"""Eviction policies: which rows a dynamic table removes, and in what order a row cap
evicts.

`TTL` and `DecayedFrequency` remove rows on the parameter server by themselves: every
training lookup sweeps on from where the last stopped, visiting every row 16 times per
expiry horizon (the TTL, or the steps a row seen once takes to decay under the threshold)
and at least a row per key it looks up, so rows go soon after they expire whatever the
share of new IDs, and `table.evict()` sweeps all of it now. A row cap (`max_rows` of the layer or
table) evicts, before each insert into a full part of the table, the lowest-ranked of a
few sampled rows: least recently seen (`LRU`, and under `TTL`), least often seen (`LFU`),
or lowest score (`DecayedFrequency`). Evicted rows' memory holds the next new rows, so a
table's memory stays flat once it is full. docs/admission_eviction.md compares the
policies with Paddle's and DeepRec's.

Time is the table's clock: its count of optimizer steps (apply calls). Training lookups and
applies record the clock as a row's last-seen step.
"""

import math

from tfps import _arguments as arguments
from tfps.table._configurable import Configurable, Kind


class EvictionPolicy(Configurable):
    """Base: the attributes Tfps>TableCreate takes."""

    op_name = "none"

    def op_attrs(self):
        return {"eviction": self.op_name}


class TTL(EvictionPolicy):
    """Rows not seen (looked up in training, or updated) for longer than a time to live go.

    Args (exactly one):
      steps: the time to live in steps of the table's clock.
      seconds: in wall-clock seconds, mapped onto the clock by the table's record of when
        its steps ran (kept in checkpoints, so time a job is down counts too).
    """

    op_name = "ttl"

    def __init__(self, steps=None, seconds=None):
        if (steps is None) == (seconds is None):
            raise ValueError(f"TTL: give exactly one of steps or seconds, got steps={steps!r}, "
                             f"seconds={seconds!r}")
        if steps is not None and (not arguments.is_int(steps) or steps < 1):
            raise ValueError(f"TTL: steps must be a positive int, got {steps!r}")
        if seconds is not None and not (arguments.is_number(seconds) and 0 < seconds < math.inf):
            raise ValueError(f"TTL: seconds must be a positive number, got {seconds!r}")
        self.steps = None if steps is None else int(steps)
        self.seconds = None if seconds is None else float(seconds)

    def op_attrs(self):
        return {"eviction": "ttl", "ttl_steps": self.steps or 0, "ttl_seconds": self.seconds or 0.0}

    def get_config(self):
        return {"steps": self.steps, "seconds": self.seconds}


class DecayedFrequency(EvictionPolicy):
    """Each row has a score: its occurrences in training lookups, each decayed by `decay`
    per step of the clock since it happened. Rows scoring under `threshold` go.

    A row seen n times in one step and then never scores n * decay^t t steps later, so it
    lives log(threshold / n) / log(decay) steps: rare rows go soon, frequent ones late.

    Args:
      decay: factor per step, in (0, 1].
      threshold: the score rows must keep (> 0); a new row's score is its occurrences, so a
        threshold above 1 removes rows seen once at the next sweep.
    """

    op_name = "decayed_frequency"

    def __init__(self, decay, threshold):
        if not (arguments.is_number(decay) and 0.0 < decay <= 1.0):
            raise ValueError(f"DecayedFrequency: decay must be a number in (0, 1], got {decay!r}")
        if not (arguments.is_number(threshold) and 0.0 < threshold < math.inf):
            raise ValueError(f"DecayedFrequency: threshold must be a positive number, got {threshold!r}")
        self.decay = float(decay)
        self.threshold = float(threshold)

    def op_attrs(self):
        return {"eviction": self.op_name, "decay": self.decay, "threshold": self.threshold}

    def get_config(self):
        return {"decay": self.decay, "threshold": self.threshold}


class LRU(EvictionPolicy):
    """Removes nothing by itself; a row cap evicts the least recently seen rows first."""

    op_name = "lru"


class LFU(EvictionPolicy):
    """Removes nothing by itself; a row cap evicts the least often seen rows first (the
    occurrence count)."""

    op_name = "lfu"


# In the order of TFPS_EVICTION_POLICIES (custom_ops/core/policies.h), after "none".
POLICIES = (TTL, DecayedFrequency, LRU, LFU)
KIND = Kind("eviction policy", "eviction", EvictionPolicy, POLICIES,
            "tfps.eviction." + ", ".join(c.__name__ for c in POLICIES), allows_none=True)
serialize, get = KIND.serialize, KIND.get  # get(None): no eviction


def op_attrs(policy, max_rows):
    """Tfps>TableCreate attributes of a policy and a cap on this table's rows (0: none)."""
    attrs = {"eviction": "none"} if policy is None else policy.op_attrs()
    return {**attrs, "max_rows": max_rows}


def check_max_rows(max_rows, owner, policy=None):
    if max_rows is None:
        if isinstance(policy, (LRU, LFU)):
            raise ValueError(f"{owner}: eviction={policy!r} only orders a row cap and removes nothing "
                             "by itself; give max_rows")
        return None
    if not arguments.is_int(max_rows) or max_rows < 1:
        raise ValueError(f"{owner}: max_rows must be a positive int (None: no cap), got {max_rows!r}")
    return int(max_rows)


def split_max_rows(max_rows, num_shards):
    """Each shard's cap of a table's `max_rows` (None: no cap, 0 for every shard)."""
    if max_rows is None:
        return [0] * num_shards
    if max_rows < num_shards:
        raise ValueError(f"max_rows={max_rows} is fewer than the table's {num_shards} shards "
                         "(one per parameter server); each needs room for a row")
    return [max_rows // num_shards + (1 if i < max_rows % num_shards else 0) for i in range(num_shards)]
