"""Admission policies: which new keys get a row in a dynamic table.

In a streaming job most IDs are seen once or twice and never again; a table that stores
every one of them grows until its parameter server runs out of memory. Under an admission
policy a key absent from the table is only counted when a training lookup sees it (each
occurrence in the data counting, however the batch repeats it) until the policy admits
it; until then the lookup reads the layer's value for unseen IDs (zeros, or the key's
initial value) and its gradient is dropped. docs/admission_eviction.md compares the
policies with Paddle's and DeepRec's.

Counts of keys not yet admitted live on each parameter server in a count-min sketch of
`sketch_bytes` (16-bit counters, 4 rows, conservative update; no undercount between
halvings), which halves its counters whenever half of them are in use so its error stays
bounded however long the stream runs: a key has to gather its occurrences within about the time the
sketch takes to fill. With `sketch_bytes=0` they are counted exactly instead (memory grows
with the keys waiting).
"""

from tfps import _arguments as arguments
from tfps.table._configurable import Configurable, Kind

DEFAULT_SKETCH_BYTES = 8 << 20


class AdmissionPolicy(Configurable):
    """Base: the attributes Tfps>TableCreate takes."""

    op_name = "none"

    def __init__(self, sketch_bytes=DEFAULT_SKETCH_BYTES):
        if not arguments.is_int(sketch_bytes) or not 0 <= sketch_bytes <= 1 << 40:
            raise ValueError(f"{type(self).__name__}: sketch_bytes must be an int in [0, 2^40] "
                             f"(0: exact counts), got {sketch_bytes!r}")
        self.sketch_bytes = int(sketch_bytes)

    def op_attrs(self):
        return {"admission": self.op_name, "sketch_bytes": self.sketch_bytes}

    def get_config(self):
        return {"sketch_bytes": self.sketch_bytes}


class MinCount(AdmissionPolicy):
    """A key gets a row once it has occurred `count` times in training lookups.

    Args:
      count: occurrences a key needs (>= 1).
      sketch_bytes: memory of the counts of keys not yet admitted, on each parameter
        server; 0 counts them exactly.
    """

    op_name = "min_count"

    def __init__(self, count, sketch_bytes=DEFAULT_SKETCH_BYTES):
        super().__init__(sketch_bytes)
        if not arguments.is_int(count) or not 1 <= count < 1 << 32:
            raise ValueError(f"MinCount: count must be an int in [1, 2^32), got {count!r}")
        self.count = int(count)

    def op_attrs(self):
        return {**super().op_attrs(), "min_count": self.count}

    def get_config(self):
        return {"count": self.count, **super().get_config()}


class Probability(AdmissionPolicy):
    """Each occurrence of a key admits it with probability `p`.

    Occurrence i of a key (counted over its whole history) admits it when a hash of (table
    seed, key, i) falls under p, so replaying the same data admits the same keys however it
    is batched. A key whose count saturates (65,535 in the sketch) is admitted.

    Args:
      p: probability per occurrence, in (0, 1].
      sketch_bytes: as for MinCount.
    """

    op_name = "probability"

    def __init__(self, p, sketch_bytes=DEFAULT_SKETCH_BYTES):
        super().__init__(sketch_bytes)
        if not (arguments.is_number(p) and 0.0 < p <= 1.0):
            raise ValueError(f"Probability: p must be a number in (0, 1], got {p!r}")
        self.p = float(p)

    def op_attrs(self):
        return {**super().op_attrs(), "admission_probability": self.p}

    def get_config(self):
        return {"p": self.p, **super().get_config()}


# In the order of TFPS_ADMISSION_POLICIES (custom_ops/core/policies.h), after "none".
POLICIES = (MinCount, Probability)
KIND = Kind("admission policy", "admission", AdmissionPolicy, POLICIES,
            "tfps.admission.MinCount(n) or tfps.admission.Probability(p)", allows_none=True)
serialize, get = KIND.serialize, KIND.get  # get(None): every key admitted


def op_attrs(policy):
    return {"admission": "none"} if policy is None else policy.op_attrs()
