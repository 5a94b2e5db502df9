"""Initial values of new keys: a function of (table seed, key, element index) only, so a
key gets the same vector on every shard, in every run, and after eviction and re-admission.
"""

from tfps.table._configurable import Configurable, Kind


class Initializer(Configurable):
    op_name = ""

    def op_params(self):
        return []


class Zeros(Initializer):
    op_name = "zeros"


class RandomUniform(Initializer):
    """Uniform in [minval, maxval)."""

    op_name = "uniform"

    def __init__(self, minval=-0.05, maxval=0.05):
        if not minval < maxval:
            raise ValueError(f"RandomUniform: minval must be < maxval, got [{minval!r}, {maxval!r})")
        self.minval, self.maxval = float(minval), float(maxval)

    def op_params(self):
        return [self.minval, self.maxval]

    def get_config(self):
        return {"minval": self.minval, "maxval": self.maxval}


class TruncatedNormal(Initializer):
    """Normal(mean, stddev) redrawn outside two standard deviations."""

    op_name = "truncated_normal"

    def __init__(self, mean=0.0, stddev=0.05):
        if not stddev > 0:
            raise ValueError(f"TruncatedNormal: stddev must be > 0, got {stddev!r}")
        self.mean, self.stddev = float(mean), float(stddev)

    def op_params(self):
        return [self.mean, self.stddev]

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev}


KIND = Kind("initializer", "initializer", Initializer, (Zeros, RandomUniform, TruncatedNormal),
            "tfps.initializers.Zeros, RandomUniform or TruncatedNormal",
            aliases={"uniform": RandomUniform})
serialize, get = KIND.serialize, KIND.get
