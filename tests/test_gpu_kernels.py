"""The table ops' GPU kernels (custom_ops/table/kernels/gpu_table_kernels.cc), driven through
TensorFlow without a GPU: built against the CUDA host emulation and registered for the CPU
under the label "gpu_emulation", they run the GPU table's own kernels on CPU threads. The
same graph of ops runs on a CPU table and on the emulated GPU table, and every output,
row, slot and metadata must agree. The CUDA build of the same source is compiled and
loaded (its kernels register for GPUs) wherever nvcc is present."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests.required_tools import skip_without_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_OPS = ["Tfps>TableCreate", "Tfps>TableFind", "Tfps>TableFindOrInsert", "Tfps>TableApplyGradients",
             "Tfps>TableInsert", "Tfps>TableRemove", "Tfps>TableSize", "Tfps>TableClock", "Tfps>TableSetClock",
             "Tfps>TableClear", "Tfps>TableExport", "Tfps>TableImport", "Tfps>TableStats", "Tfps>TableEvict",
             "Tfps>TableCountSkippedStep"]
DIM = 4


@pytest.fixture(scope="module")
def emulated_kernels(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu_emulated")
    build = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "build_gpu_ops.py"), "emulated",
                            "--out", str(work / "emulated.so"), "--work", str(work / "objects")],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    tf.compat.v1.load_op_library(str(work / "emulated.so"))


def on_emulated_gpu(graph):
    return graph._kernel_label_map({op: "gpu_emulation" for op in TABLE_OPS})  # pylint: disable=protected-access


def tables(graph, emulated, **kwargs):
    with graph.as_default():
        if emulated:
            with on_emulated_gpu(graph):
                return tfps.DynamicTable(DIM, **kwargs)
        return tfps.DynamicTable(DIM, **kwargs)


def labelled(graph, emulated):
    return on_emulated_gpu(graph) if emulated else _Nothing()


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# L1 as large as the gradients: FTRL's branch that sets coordinates exactly to 0.
NAMED_OPTIMIZERS = {"ftrl_l1": lambda: tfps.optimizers.Ftrl(0.5, l1_regularization_strength=1.0),
                    "rmsprop": lambda: tfps.optimizers.RMSprop(0.1, momentum=0.5)}


def run_script(optimizer, key_dtype, emulated):
    """One graph of every table op; returns each step's fetched outputs and the rows."""
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 1 << 62, 40, dtype=np.int64)
    keys = np.concatenate([raw, raw[:10]])  # repeated keys within one call
    rng.shuffle(keys)
    if key_dtype == tf.uint64:
        keys = keys | np.int64(-(1 << 63))  # keys with the top bit set
    as_keys = lambda k: tf.constant(k.view(np.uint64) if key_dtype == tf.uint64 else k)  # noqa: E731
    graph = tf.Graph()
    optimizer = NAMED_OPTIMIZERS.get(optimizer, lambda: optimizer)()
    table = tables(graph, emulated, optimizer=optimizer, seed=11)
    results = {}
    with graph.as_default(), labelled(graph, emulated), tf.compat.v1.Session(graph=graph) as session:
        occurrences = tf.constant(rng.integers(1, 4, keys.size), tf.int64)
        results["lookup"] = session.run(table.find_or_insert(as_keys(keys), occurrences, return_admitted=True))
        for i, rate in enumerate([None, 0.05, 0.2]):
            grads = tf.constant(rng.normal(size=(keys.size, DIM)).astype(np.float32))
            session.run(table.apply_gradients(as_keys(keys), grads, step=-1, learning_rate=rate))
        absent = rng.integers(0, 1 << 62, 5, dtype=np.int64)
        results["find"] = session.run(table.find(as_keys(np.concatenate([keys[:8], absent])), return_exists=True))
        session.run(table.insert(as_keys(keys[:3]), tf.constant(rng.normal(size=(3, DIM)).astype(np.float32))))
        results["removed"] = session.run(table.remove(as_keys(np.concatenate([keys[3:9], absent]))))
        results["size"], results["clock"] = session.run([table.size(), table.clock()])
        session.run(table.set_clock(100))
        session.run(table.apply_gradients(as_keys(keys[20:25]), tf.ones([5, DIM]), step=-1))
        results["clock_after_set"] = session.run(table.clock())
        results["rows"] = export_all(session, table, chunk=7)
        copy = tables(graph, emulated, optimizer=optimizer, seed=11)
        rows = tfps.TableRows(*(tf.constant(a) for a in results["rows"]))
        session.run(copy.import_rows(rows))
        results["imported"] = export_all(session, copy, chunk=1000)
        session.run(table.clear())
        results["size_after_clear"] = session.run(table.size())
    return results


def export_all(session, table, chunk):
    cursor_in = tf.compat.v1.placeholder(tf.int64, [])
    rows, next_cursor = table.export_chunk(cursor_in, chunk)
    parts, cursor = [], 0
    while cursor >= 0:
        part, cursor = session.run([rows, next_cursor], {cursor_in: cursor})
        assert len(part.keys) <= chunk
        parts.append(part)
    keys = np.concatenate([p.keys for p in parts])
    order = np.argsort(keys)
    assert len(np.unique(keys)) == len(keys)  # each row exported once
    return tuple(np.concatenate([getattr(p, field) for p in parts])[order]
                 for field in ("keys", "values", "slots", "metadata"))


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.uint64])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam", "ftrl", "ftrl_l1", "rmsprop"])
def test_every_table_op_on_the_emulated_gpu_matches_the_cpu_table(emulated_kernels, optimizer, key_dtype):
    cpu = run_script(optimizer, key_dtype, emulated=False)
    gpu = run_script(optimizer, key_dtype, emulated=True)
    # Initial values are equal bit for bit, as are the lookup's admitted mask.
    for want, got in zip(cpu["lookup"], gpu["lookup"]):
        np.testing.assert_array_equal(got, want, err_msg="lookup")
    for name in ("find", "rows", "imported"):
        for want, got in zip(cpu[name], gpu[name]):
            # Optimizer formulas agree to float rounding; initial values and metadata exactly.
            if np.asarray(want).dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
            else:
                np.testing.assert_array_equal(got, want, err_msg=name)
    for name in ("removed", "size", "clock", "clock_after_set", "size_after_clear"):
        assert gpu[name] == cpu[name], name
    assert cpu["removed"] == 6 and cpu["clock_after_set"] == 101 and cpu["size_after_clear"] == 0
    if optimizer == "ftrl_l1":
        cpu_values, gpu_values = cpu["rows"][1], gpu["rows"][1]
        np.testing.assert_array_equal(gpu_values == 0.0, cpu_values == 0.0)
        assert (cpu_values == 0.0).mean() > 0.2


def run_error(build_and_run):
    graph = tf.Graph()
    with graph.as_default(), on_emulated_gpu(graph), tf.compat.v1.Session(graph=graph) as session:
        return build_and_run(session)


@pytest.mark.parametrize("case, error, message", [
    ("nan_gradient", tf.errors.InvalidArgumentError, "gradients contain NaN or Inf; no row was updated"),
    ("inf_insert", tf.errors.InvalidArgumentError, "values contain NaN or Inf"),
    ("stats", tf.errors.UnimplementedError, "not available for a table on a GPU"),
    ("skipped_step", tf.errors.UnimplementedError, "TableCountSkippedStep is not available for a table on a GPU"),
    ("admission", tf.errors.UnimplementedError, "a table on a GPU has no admission"),
    ("dim", tf.errors.InvalidArgumentError, "dim mismatch"),
])
def test_bad_calls_on_the_emulated_gpu_are_errors_that_say_why(emulated_kernels, case, error, message):
    def build_and_run(session):
        if case == "admission":
            table = tfps.DynamicTable(DIM, admission=tfps.admission.MinCount(2))
            return session.run(table.size())
        table = tfps.DynamicTable(DIM)
        keys = tf.constant([1, 2], tf.int64)
        session.run(table.find_or_insert(keys))
        if case == "nan_gradient":
            session.run(table.apply_gradients(keys, tf.constant([[1.0] * DIM, [np.nan] * DIM])))
        elif case == "inf_insert":
            session.run(table.insert(keys, tf.constant([[1.0] * DIM, [np.inf] * DIM])))
        elif case == "stats":
            session.run(tfps._ops.ops.tfps_table_stats(table.resource_handle))  # pylint: disable=protected-access
        elif case == "skipped_step":
            session.run(table.count_skipped_step())
        else:
            session.run(tfps._ops.ops.tfps_table_find(table.resource_handle, keys, dim=DIM + 1))  # pylint: disable=protected-access

    with pytest.raises(error, match=message):
        run_error(build_and_run)
    if case in ("nan_gradient", "inf_insert"):
        # Nothing changed: the rows still read their initial values on a fresh lookup.
        def rows_after(session):
            table = tfps.DynamicTable(DIM, seed=5)
            keys = tf.constant([1, 2], tf.int64)
            before = session.run(table.find_or_insert(keys))
            bad = tf.constant([[np.nan] * DIM, [1.0] * DIM])
            with pytest.raises(tf.errors.InvalidArgumentError):
                session.run(table.apply_gradients(keys, bad) if case == "nan_gradient" else table.insert(keys, bad))
            return before, session.run(table.find(keys))

        before, after = run_error(rows_after)
        np.testing.assert_array_equal(after, before)


@skip_without_tool("nvcc", "the CUDA build of the GPU kernels is compiled where a CUDA toolkit is present")
def test_the_cuda_build_of_the_gpu_kernels_compiles_links_and_registers(tmp_path):
    env = dict(os.environ)
    build = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "build_gpu_ops.py"), "cuda",
                            "--out", str(tmp_path / "gpu.so"), "--work", str(tmp_path / "objects")],
                           capture_output=True, text=True, timeout=1500, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    # Loaded beside the op library, the kernels register for DEVICE_GPU (no GPU needed, and
    # no libcudart: the library carries the toolkit's static runtime).
    check = subprocess.run([sys.executable, "-c", f"""
import tensorflow as tf, tfps
from tensorflow.python.framework import kernels
tf.load_op_library({str(tmp_path / 'gpu.so')!r})
for op in ("Tfps>TableFind", "Tfps>TableApplyGradients", "Tfps>TableExport"):
    devices = {{k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}}
    assert devices == {{"CPU", "GPU"}}, (op, devices)
print("registered")
"""], capture_output=True, text=True, timeout=300, env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"))
    assert check.returncode == 0 and "registered" in check.stdout, check.stderr[-3000:]
