"""A table's transfer_dtype: with bfloat16, training reads rows rounded to bfloat16 and the
parameter servers apply gradients rounded so, in every execution mode and through a worker
cache, against the NumPy oracles with bfloat16 rounding written from the format's
definition; the rounding happens on each parameter server for rows and on the worker for
gradients (so half the bytes cross); inference, checkpoints and exports stay float32."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.cluster_run import run_cluster_program
from tests.reference import bfloat16_rounded
from tests.test_sparse_updates import (KERAS_SGD, VOCAB, build_model, check_against_oracle, data,
                                       numpy_oracle, train)
from tests.test_worker_cache import assert_follows_simulation, cached_training_oracle

PS = "/job:ps/replica:0/task:{}/device:CPU:0"


def trained_with_bfloat16(mode, optimizer_name="adagrad", **layer_args):
    ids, labels = data()
    model, layer, head = build_model(optimizer_name, transfer_dtype="bfloat16", **layer_args)
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD["current"](), ids, labels)
    return model, layer, head, ids, labels, kernel0


@pytest.mark.parametrize("mode", ["eager", "function", "range_loop", "fit", "fit_spe10"])
def test_training_reads_and_sends_rows_and_gradients_rounded_to_bfloat16(mode):
    _, layer, head, ids, labels, kernel0 = trained_with_bfloat16(mode)
    check_against_oracle(layer, head, "adagrad", ids, labels, kernel0, transfer=bfloat16_rounded)
    # The rounding is real: float32 training ends elsewhere, beyond the comparison's tolerance.
    exact = numpy_oracle("adagrad", ids, labels, kernel0, 0.0, layer.seed)[0]
    rows = dict(zip(layer.table.export().keys.numpy().tolist(), layer.table.export().values.numpy()))
    assert max(np.abs(rows[int(k)] - exact[int(k)]).max() / np.abs(exact[int(k)]).max() for k in VOCAB) > 1e-3


def test_each_table_optimizer_applies_the_rounded_gradients():
    for name in ("sgd", "adam", "ftrl"):
        _, layer, head, ids, labels, kernel0 = trained_with_bfloat16("fit_spe10", name)
        check_against_oracle(layer, head, name, ids, labels, kernel0, transfer=bfloat16_rounded)


def test_the_regularizer_sees_the_rounded_row_the_step_read():
    _, layer, head, ids, labels, kernel0 = trained_with_bfloat16(
        "function", embeddings_regularizer=keras.regularizers.L2(0.5))
    check_against_oracle(layer, head, "adagrad", ids, labels, kernel0, transfer=bfloat16_rounded, l2=0.5)


def test_inference_reads_the_float32_rows():
    _, layer, _, ids, _, _ = trained_with_bfloat16("fit")
    exported = layer.table.export()
    rows = dict(zip(exported.keys.numpy().tolist(), exported.values.numpy().astype(np.float64)))
    embedded = layer(tf.constant(ids[0]), training=False).numpy()
    summed = lambda read: np.stack([sum(read(rows[int(k)]) for k in example) for example in ids[0]])  # noqa: E731
    np.testing.assert_allclose(embedded, summed(lambda row: row), rtol=1e-6, atol=1e-7)
    assert not np.allclose(embedded, summed(bfloat16_rounded), rtol=1e-6, atol=1e-7)


def test_a_worker_cache_pulls_rounded_rows_and_pushes_rounded_sums():
    _, layer, head, ids, labels, kernel0 = trained_with_bfloat16(
        "fit_spe10", worker_cache_rows=5, max_staleness_steps=2)
    rows, slots, kernel = cached_training_oracle("adagrad", ids, labels, kernel0, layer.seed, 2, 5,
                                                 transfer=bfloat16_rounded)
    exported = layer.table.export()
    assert_follows_simulation(exported.keys.numpy(), exported.values.numpy(), exported.slots.numpy(),
                              rows, slots)
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=2e-4, atol=2e-6)


def test_under_parameter_server_strategy_rows_cross_as_bfloat16_both_ways():
    out = run_cluster_program("pss_worker_cache.py", "1000", "bfloat16")
    for run in ("fit", "custom_loop"):
        trained = out[run]
        rows, slots, kernel = cached_training_oracle(
            "adagrad", *data(), np.array(trained["kernel0"]), trained["seed"], 2, 1000,
            transfer=bfloat16_rounded)
        assert_follows_simulation(trained["keys"], trained["values"], trained["slots"], rows, slots)
        np.testing.assert_allclose(trained["kernel"], kernel, rtol=2e-4, atol=2e-6)
    float_casts = [cast for cast in out["casts"] if cast[1] != "int64" and cast[2] != "int64"]
    # Each PS rounds the rows it sends and widens the gradients it receives; the caller
    # rounds the gradients it sends and widens the rows it receives.
    assert sorted(float_casts) == sorted(
        [[PS.format(i), "float32", "bfloat16"] for i in range(2)]
        + [[PS.format(i), "bfloat16", "float32"] for i in range(2)]
        + [["", "float32", "bfloat16"], ["", "bfloat16", "float32"]])


def test_float32_sends_rows_and_gradients_as_they_are():
    out = run_cluster_program("pss_worker_cache.py", "1000", "float32")
    assert [cast for cast in out["casts"] if "bfloat16" in cast] == []


@pytest.mark.parametrize("value, message", [
    ("float16", "float16 would lose small gradients: use bfloat16"),
    (tf.float64, "transfer_dtype must be float32 or bfloat16"),
    ("int8", "transfer_dtype must be float32 or bfloat16"),
    ("bf16", "transfer_dtype must be float32 or bfloat16, got 'bf16'"),
    (None, "transfer_dtype must be float32 or bfloat16"),
])
def test_other_transfer_dtypes_are_refused_naming_the_choices(value, message):
    with pytest.raises(ValueError, match=message):
        tfps.keras_layers.DynamicEmbedding(4, transfer_dtype=value)


def test_transfer_dtype_round_trips_through_the_layer_config():
    layer = tfps.keras_layers.DynamicEmbedding(4, transfer_dtype=tf.bfloat16)
    config = layer.get_config()
    assert config["transfer_dtype"] == "bfloat16"
    copy = tfps.keras_layers.DynamicEmbedding.from_config(config)
    assert copy.table.transfer_dtype == tf.bfloat16
    assert tfps.keras_layers.DynamicEmbedding(4).get_config()["transfer_dtype"] == "float32"
