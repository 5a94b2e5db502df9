"""Independent NumPy/pure-Python references for the table: the initial-value spec and the
optimizer formulas, written from their definitions rather than from the C++."""

import math

import numpy as np

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def mix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    x ^= x >> 33
    return x


def key_stream(seed, key):
    return mix64((key + mix64((seed & _M64) ^ _GOLDEN)) & _M64)


def random_bits(seed, key, counter):
    return mix64((key_stream(seed, key) + (counter + 1) * _GOLDEN) & _M64)


def mix32(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def random_bits32(seed, key, i):
    stream = key_stream(seed, key)
    return mix32((((stream & 0xFFFFFFFF) + i * 0x9E3779B9) & 0xFFFFFFFF) ^ (stream >> 32))


def initial_row(key, dim, seed, kind, a=0.0, b=0.0):
    """Initial vector of `key` (any Python int; taken modulo 2^64) as float32 [dim]."""
    key &= _M64
    out = np.zeros(dim, np.float32)
    a, b = float(np.float32(a)), float(np.float32(b))
    for i in range(dim):
        if kind == "uniform":
            u = np.float32(random_bits32(seed, key, i) >> 8) * np.float32(2.0 ** -24)
            out[i] = np.float32(a) + (np.float32(b) - np.float32(a)) * u
        elif kind == "truncated_normal":
            for attempt in range(64):
                c = (i << 7) | (attempt << 1)
                u1 = ((random_bits(seed, key, c) >> 11) + 0.5) * 2.0 ** -53
                u2 = ((random_bits(seed, key, c | 1) >> 11) + 0.5) * 2.0 ** -53
                z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
                if -2.0 <= z <= 2.0:
                    out[i] = np.float32(a + b * z)
                    break
    return out


class RowOptimizer:
    """Float64 reference of each sparse optimizer over one row's value and slots."""

    def __init__(self, name, dim, lr, **hp):
        self.name, self.dim, self.lr, self.hp = name, dim, lr, hp

    def initial_slots(self):
        acc0 = self.hp.get("initial_accumulator_value", 0.1)
        return {
            "sgd": np.zeros((0, self.dim)),
            "adagrad": np.full((1, self.dim), acc0),
            "adam": np.zeros((2, self.dim)),
            "ftrl": np.stack([np.full(self.dim, acc0), np.zeros(self.dim)]),
            "rmsprop": np.zeros((2, self.dim)),
        }[self.name]

    def apply(self, value, slots, g, step):
        lr, hp = self.lr, self.hp
        if self.name == "sgd":
            return value - lr * g, slots
        if self.name == "adagrad":
            acc = slots[0] + g * g
            return value - lr * g / (np.sqrt(acc) + hp.get("epsilon", 1e-7)), acc[None]
        if self.name == "adam":
            b1, b2, eps = hp.get("beta_1", 0.9), hp.get("beta_2", 0.999), hp.get("epsilon", 1e-7)
            m = b1 * slots[0] + (1 - b1) * g
            v = b2 * slots[1] + (1 - b2) * g * g
            lr_t = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
            return value - lr_t * m / (np.sqrt(v) + eps), np.stack([m, v])
        if self.name == "ftrl":
            l1, l2, p = hp.get("l1", 0.0), hp.get("l2", 0.0), hp.get("lr_power", -0.5)
            acc, lin = slots
            new_acc = acc + g * g
            lin = lin + g - (new_acc ** -p - acc ** -p) / lr * value
            quad = new_acc ** -p / lr + 2 * l2
            value = np.where(np.abs(lin) > l1, (np.sign(lin) * l1 - lin) / quad, 0.0)
            return value, np.stack([new_acc, lin])
        if self.name == "rmsprop":  # TensorFlow's ResourceSparseApplyRMSProp
            rho, momentum, eps = hp.get("rho", 0.9), hp.get("momentum", 0.0), hp.get("epsilon", 1e-7)
            ms = rho * slots[0] + (1 - rho) * g * g
            mom = momentum * slots[1] + lr * g / np.sqrt(ms + eps)
            return value - mom, np.stack([ms, mom])
        raise ValueError(self.name)


def bfloat16_rounded(x):
    """`x` rounded to bfloat16 (float32's top 16 bits, round to nearest, ties to even), as
    float64: from the format's definition, not TensorFlow's cast."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
