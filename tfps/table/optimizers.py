"""Server-side sparse optimizers of a dynamic table.

They are applied by the table's own ops on the parameter server, row by row, with
TensorFlow's formulas: a pre-sized Keras embedding trained with the Keras optimizer of the
same name and hyperparameters follows the same trajectory.

Each class mirrors one line of the C++ registry (TFPS_OPTIMIZERS in
custom_ops/core/optimizer.h): `op_name`, `num_slots` and the names `op_params()` returns;
`OPTIMIZERS` lists them in the registry's order, which checkpoints record. A test checks
the two against each other.
"""

import tensorflow as tf

from tfps import _arguments as arguments
from tfps.table._configurable import Kind


class SparseOptimizer:
    """Base: a name the op understands and its named hyperparameters.

    learning_rate: a positive number, a Keras `LearningRateSchedule` (evaluated, like the
    Keras optimizer's own, on the Keras optimizer's step when a model trains the table), or
    a `tf.Variable` that a callback may change (create it under the strategy's scope when
    training under ParameterServerStrategy). The table is created with the rate at step 0
    (or the variable's value then), which is what direct `table.apply_gradients` calls use.

    clip_row_norm: if set, each row's gradient (summed over the step) is scaled down to this
    L2 norm before the update, so one hot or outlier ID cannot move its row far in a step.
    """

    op_name = ""
    num_slots = 0  # float slots of dim values per row

    def __init__(self, learning_rate, clip_row_norm=None):
        if clip_row_norm is not None:
            _check_positive("clip_row_norm", clip_row_norm, type(self).__name__)
            clip_row_norm = float(clip_row_norm)
        self.clip_row_norm = clip_row_norm
        if isinstance(learning_rate, dict):  # a serialized schedule (get_config)
            learning_rate = _schedules().deserialize(learning_rate)
        self._rate = learning_rate if _changes(learning_rate) else None
        initial = _initial_rate(learning_rate)
        _check_positive("learning_rate", initial, type(self).__name__)
        self.learning_rate = float(initial)

    def learning_rate_at(self, iterations):
        """The learning rate of an apply at Keras optimizer step `iterations` (float32
        scalar), or None when it is the fixed rate the table was created with."""
        if self._rate is None:
            return None
        if isinstance(self._rate, tf.Variable):
            return tf.cast(self._rate.read_value(), tf.float32)
        return tf.cast(self._rate(iterations), tf.float32)

    def op_params(self):
        """Hyperparameters after learning_rate, by their names in the C++ registry."""
        return {}

    def _rate_config(self):
        if isinstance(self._rate, _schedules().LearningRateSchedule):
            return _schedules().serialize(self._rate)
        return self.learning_rate  # a variable is saved by its value, as Keras does

    def get_config(self):
        return {"learning_rate": self._rate_config(), **self._clip_config()}

    def _clip_config(self):
        return {} if self.clip_row_norm is None else {"clip_row_norm": self.clip_row_norm}

    def clipped(self, gradients):
        """Each row of gradients [n, dim] scaled down to norm clip_row_norm if it is longer."""
        if self.clip_row_norm is None:
            return gradients
        return tf.clip_by_norm(gradients, self.clip_row_norm, axes=[1])

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()


def _schedules():
    import tf_keras
    return tf_keras.optimizers.schedules


def _changes(learning_rate):
    """Whether a learning rate can change while training: a schedule or a variable."""
    return isinstance(learning_rate, (tf.Variable, _schedules().LearningRateSchedule))


def _initial_rate(learning_rate):
    if isinstance(learning_rate, tf.Variable):
        return float(learning_rate.numpy())
    if isinstance(learning_rate, _schedules().LearningRateSchedule):
        return float(learning_rate(0))
    return learning_rate


class SGD(SparseOptimizer):
    """value -= learning_rate * gradient."""

    op_name = "sgd"

    def __init__(self, learning_rate=0.01, clip_row_norm=None):
        super().__init__(learning_rate, clip_row_norm)


class Adagrad(SparseOptimizer):
    """accumulator += g^2; value -= lr * g / (sqrt(accumulator) + epsilon)."""

    op_name = "adagrad"
    num_slots = 1  # accumulator

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                 clip_row_norm=None):
        super().__init__(learning_rate, clip_row_norm)
        _check_positive("initial_accumulator_value", initial_accumulator_value, "Adagrad")
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.epsilon = float(epsilon)

    def op_params(self):
        return {"initial_accumulator": self.initial_accumulator_value, "epsilon": self.epsilon}

    def get_config(self):
        return {"learning_rate": self._rate_config(),
                "initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon, **self._clip_config()}


class Adam(SparseOptimizer):
    """Lazy Adam: each row keeps its own step count, so rarely seen rows are not decayed."""

    op_name = "adam"
    num_slots = 2  # m, v

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 clip_row_norm=None):
        super().__init__(learning_rate, clip_row_norm)
        _check_fraction("beta_1", beta_1, "Adam")
        _check_fraction("beta_2", beta_2, "Adam")
        _check_positive("epsilon", epsilon, "Adam")
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def op_params(self):
        return {"beta1": self.beta_1, "beta2": self.beta_2, "epsilon": self.epsilon}

    def get_config(self):
        return {"learning_rate": self._rate_config(), "beta_1": self.beta_1,
                "beta_2": self.beta_2, "epsilon": self.epsilon, **self._clip_config()}


class Ftrl(SparseOptimizer):
    """FTRL-Proximal (TensorFlow's ApplyFtrlV2 without shrinkage); beta folds into l2."""

    op_name = "ftrl"
    num_slots = 2  # accumulator, linear

    def __init__(self, learning_rate=0.001, learning_rate_power=-0.5,
                 initial_accumulator_value=0.1, l1_regularization_strength=0.0,
                 l2_regularization_strength=0.0, beta=0.0, clip_row_norm=None):
        super().__init__(learning_rate, clip_row_norm)
        if learning_rate_power > 0:
            raise ValueError(f"Ftrl: learning_rate_power must be <= 0, got {learning_rate_power!r}")
        _check_positive("initial_accumulator_value", initial_accumulator_value, "Ftrl")
        for name, v in (("l1_regularization_strength", l1_regularization_strength),
                        ("l2_regularization_strength", l2_regularization_strength),
                        ("beta", beta)):
            if v < 0:
                raise ValueError(f"Ftrl: {name} must be >= 0, got {v!r}")
        if beta and self._rate is not None:
            raise ValueError("Ftrl: beta folds into l2 as beta / (2 * learning_rate), which a "
                             "changing learning_rate would make stale; use "
                             "l2_regularization_strength, or a fixed learning_rate, with beta")
        self.learning_rate_power = float(learning_rate_power)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.l1_regularization_strength = float(l1_regularization_strength)
        self.l2_regularization_strength = float(l2_regularization_strength)
        self.beta = float(beta)

    def op_params(self):
        l2 = self.l2_regularization_strength + self.beta / (2.0 * self.learning_rate)
        return {"initial_accumulator": self.initial_accumulator_value,
                "l1": self.l1_regularization_strength, "l2": l2,
                "lr_power": self.learning_rate_power}

    def get_config(self):
        return {"learning_rate": self._rate_config(),
                "learning_rate_power": self.learning_rate_power,
                "initial_accumulator_value": self.initial_accumulator_value,
                "l1_regularization_strength": self.l1_regularization_strength,
                "l2_regularization_strength": self.l2_regularization_strength,
                "beta": self.beta, **self._clip_config()}


class RMSprop(SparseOptimizer):
    """TensorFlow's ResourceSparseApplyRMSProp: ms = rho * ms + (1 - rho) * g^2;
    mom = momentum * mom + lr * g / sqrt(ms + epsilon); value -= mom, on the rows a step
    looks up only. With momentum > 0 that is what tf_keras.optimizers.legacy.RMSprop does to
    an embedding; with momentum 0 Keras instead decays every row's ms each step (and adds
    epsilon outside the square root), which a table of rows it never sees cannot do, so the
    table stays lazy. Not centered."""

    op_name = "rmsprop"
    num_slots = 2  # ms, mom

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7,
                 clip_row_norm=None):
        super().__init__(learning_rate, clip_row_norm)
        _check_fraction("rho", rho, "RMSprop")
        _check_fraction("momentum", momentum, "RMSprop")
        _check_positive("epsilon", epsilon, "RMSprop")
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)

    def op_params(self):
        return {"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon}

    def get_config(self):
        return {"learning_rate": self._rate_config(), "rho": self.rho, "momentum": self.momentum,
                "epsilon": self.epsilon, **self._clip_config()}


# In the C++ registry's order.
OPTIMIZERS = (SGD, Adagrad, Adam, Ftrl, RMSprop)
KIND = Kind("optimizer", "optimizer", SparseOptimizer, OPTIMIZERS,
            "tfps.optimizers." + ", ".join(c.__name__ for c in OPTIMIZERS))
serialize, get = KIND.serialize, KIND.get


def _check_positive(name, value, owner):
    if not (arguments.is_number(value) and value > 0):
        raise ValueError(f"{owner}: {name} must be a positive number, got {value!r}")


def _check_fraction(name, value, owner):
    if not (arguments.is_number(value) and 0.0 <= value < 1.0):
        raise ValueError(f"{owner}: {name} must be in [0, 1), got {value!r}")
