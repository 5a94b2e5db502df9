"""Checkpoint round trip, configuration round trip, memory return, and the loader's
refusal of a library built for another TensorFlow."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests.table_rows import assert_same_rows, sorted_rows
from tfps import _ops


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam", "ftrl"])
def test_checkpoint_saves_and_restores_keys_values_slots_metadata(tmp_path, optimizer):
    table = tfps.DynamicTable(3, optimizer=optimizer, seed=4)
    keys = np.array([0, -1, 2 ** 63 - 1, -(2 ** 63), 12, 13], np.int64)
    rng = np.random.default_rng(0)
    for step in range(3):
        table.apply_gradients(keys[step:], rng.normal(size=(len(keys) - step, 3)), step=step + 5)
    saved = sorted_rows(table)
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.save(str(tmp_path / "ckpt"))

    table.apply_gradients(keys, np.ones((6, 3)), step=99)
    table.remove([12])
    table.find_or_insert([777])
    checkpoint.restore(path).assert_consumed()
    restored = sorted_rows(table)
    assert_same_rows(saved, restored)

    fresh = tfps.DynamicTable(3, optimizer=optimizer, seed=4)
    tf.train.Checkpoint(table=fresh).restore(path).assert_consumed()
    assert_same_rows(saved, sorted_rows(fresh))


def test_checkpoint_written_inside_a_tf_function_and_by_a_manager(tmp_path):
    table = tfps.DynamicTable(2)
    table.find_or_insert([1, 2, 3])
    checkpoint = tf.train.Checkpoint(table=table)
    saved = sorted_rows(table)
    traced = tf.function(lambda path: checkpoint.write(path))
    path = traced(tf.constant(str(tmp_path / "in_function"))).numpy().decode()
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "managed"), 2)
    manager.save()
    for restore_from in (path, manager.latest_checkpoint):
        table.clear()
        table.find_or_insert([9])
        checkpoint.read(restore_from).expect_partial()  # write() keeps no save counter
        assert_same_rows(saved, sorted_rows(table))


def test_optimizer_and_initializer_configs_round_trip():
    for opt in (tfps.optimizers.SGD(0.2), tfps.optimizers.Adagrad(0.3, 0.2, 1e-6),
                tfps.optimizers.Adam(0.1, 0.8, 0.9, 1e-6), tfps.optimizers.Ftrl(0.1, -0.6, 0.2, 0.1, 0.3, 0.5)):
        assert tfps.optimizers.get(tfps.optimizers.serialize(opt)) == opt
    for init in (tfps.initializers.Zeros(), tfps.initializers.RandomUniform(-1, 2),
                 tfps.initializers.TruncatedNormal(0.5, 0.1)):
        assert tfps.initializers.get(tfps.initializers.serialize(init)) == init


def _run_python(code, **env):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)),
                          timeout=300)


def _rss_readings(code, **env):
    """Runs `code` in a fresh interpreter where rss() reads its resident bytes; returns the
    numbers it prints."""
    prelude = """
        import gc, numpy as np, tfps
        def rss():
            return int(open('/proc/self/statm').read().split()[1]) * 4096
    """
    out = _run_python(textwrap.dedent(prelude) + textwrap.dedent(code), **env)
    assert out.returncode == 0, out.stderr[-2000:]
    return list(map(int, out.stdout.split()))


def test_memory_of_a_deleted_table_goes_back():
    base, grown, after = _rss_readings("""
        base = rss()
        t = tfps.DynamicTable(64, optimizer='adagrad')
        for b in range(4):
            t.find_or_insert(np.arange(b * 250_000, (b + 1) * 250_000, dtype=np.int64))
        grown = rss()
        del t
        gc.collect()
        print(base, grown, rss())
    """)
    table_bytes = 1_000_000 * 64 * 4 * 2
    assert grown - base >= table_bytes
    assert after - base <= 0.15 * (grown - base), (base, grown, after)


@pytest.mark.parametrize("cache_mb", ["0", "512"])
def test_a_freed_large_output_is_kept_only_by_the_output_cache(cache_mb):
    base, held, after = _rss_readings("""
        t = tfps.DynamicTable(64, optimizer='sgd')
        keys = np.arange(250_000, dtype=np.int64)
        t.find_or_insert(keys)
        gc.collect()
        base = rss()
        rows = t.find(keys)
        held = rss()
        del rows
        gc.collect()
        print(base, held, rss())
    """, TFPS_OUTPUT_CACHE_MB=cache_mb)
    output_bytes = 250_000 * 64 * 4
    if cache_mb == "0":
        # Each output is fresh memory and goes back when freed, whatever TF's allocator pools.
        assert held - base >= 0.9 * output_bytes, (base, held, after)
        assert after - base <= 0.1 * output_bytes, (base, held, after)
    else:
        # The find reuses the block freed by find_or_insert, and the cache keeps it after.
        assert abs(held - base) <= 0.1 * output_bytes, (base, held, after)
        assert abs(after - base) <= 0.1 * output_bytes, (base, held, after)


def test_loader_names_both_versions_for_a_mismatched_library(tmp_path):
    fake = tmp_path / "_tfps_ops.so"
    fake.write_bytes(b"\x7fELF....TFPS_BUILT_FOR_TENSORFLOW=2.16.2;....")
    assert _ops.built_for_tensorflow(str(fake)) == "2.16.2"
    with pytest.raises(ImportError, match=r"built for TensorFlow 2\.16\.2, but TensorFlow 2\.99\.0 is installed"):
        _ops.check_library(str(fake), "2.99.0")
    real = [f for f in os.listdir(os.path.dirname(_ops.__file__)) if f.startswith("_tfps_ops")]
    assert _ops.built_for_tensorflow(os.path.join(os.path.dirname(_ops.__file__), real[0])) == tf.__version__
