"""Initial values of new keys: a function of (table seed, key, element index) only, so a
key gets the same vector on every shard, in every run, and after eviction and re-admission.
"""

from tfps.configurable import Configurable


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


_BY_NAME = {"zeros": Zeros, "uniform": RandomUniform, "random_uniform": RandomUniform,
            "truncated_normal": TruncatedNormal}


def serialize(initializer):
    return {"class_name": type(initializer).__name__, "config": initializer.get_config()}


def get(identifier):
    """An initializer from an instance, a name ("zeros") or a `serialize` dict."""
    if isinstance(identifier, Initializer):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _BY_NAME:
        return _BY_NAME[identifier.lower()]()
    if isinstance(identifier, dict):
        by_class = {cls.__name__: cls for cls in (Zeros, RandomUniform, TruncatedNormal)}
        if identifier.get("class_name") in by_class:
            return by_class[identifier["class_name"]].from_config(identifier.get("config", {}))
    raise ValueError(f"unknown tfps initializer {identifier!r}; use tfps.initializers.Zeros, "
                     "RandomUniform or TruncatedNormal")
