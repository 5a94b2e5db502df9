"""Every bad input to the table gets a clear error naming the op and the problem."""

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tfps._ops import ops

ERRORS = (tf.errors.InvalidArgumentError, ValueError)


def test_non_integer_keys_are_rejected_by_name(run):
    table = tfps.DynamicTable(2)
    for bad in (tf.constant([1.5]), tf.constant(["a"])):
        with pytest.raises(TypeError, match=r"DynamicTable.find: keys must be an integer tensor"):
            run(table.find, bad)


@pytest.mark.parametrize("keys,grads,message", [
    (np.zeros([2], np.int64), np.zeros([2, 3], np.float32), r"\[2, 2\], got \[2,3\]|Dimensions must be equal"),
    (np.zeros([3], np.int64), np.zeros([2, 2], np.float32), r"\[3, 2\], got \[2,2\]|Dimensions must be equal"),
    (np.zeros([2, 1], np.int64), np.zeros([2, 2], np.float32), r"keys must be a vector|must be rank 1"),
    (np.zeros([2], np.int64), np.zeros([2], np.float32), r"\[2, 2\], got \[2\]|must be rank 2"),
])
def test_apply_gradients_shape_errors(run, keys, grads, message):
    table = tfps.DynamicTable(2)
    with pytest.raises(ERRORS, match=message):
        run(lambda k, g: table.apply_gradients(k, g), tf.constant(keys), tf.constant(grads))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_gradient_rejects_the_whole_apply(run, bad):
    table = tfps.DynamicTable(2, optimizer="adagrad")
    keys = tf.constant([1, 2, 3], tf.int64)
    table.find_or_insert(keys)
    before = table.export()
    grads = np.ones([3, 2], np.float32)
    grads[2, 1] = bad
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Tfps>TableApplyGradients: gradients contain NaN or Inf"):
        run(lambda k, g: table.apply_gradients(k, g), keys, tf.constant(grads))
    after = table.export()
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("method", ["insert", "import_rows"])
def test_non_finite_values_or_slots_are_refused_and_no_row_is_written(run, method, bad):
    table = tfps.DynamicTable(2, optimizer="adagrad")
    table.insert(tf.constant([1], tf.int64), tf.constant([[0.5, 0.5]]))
    before = table.export()
    keys = tf.constant([1, 2], tf.int64)
    values = np.ones([2, 2], np.float32)
    slots = np.ones([2, 1, 2], np.float32)
    (values if method == "insert" else slots)[1, 0] = bad
    what = "values" if method == "insert" else "slots"
    call = (lambda k, v, s: table.insert(k, v)) if method == "insert" else \
        (lambda k, v, s: table.import_rows(tfps.TableRows(k, v, s, tf.zeros([2, 3], tf.int64))))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{what} contain NaN or Inf"):
        run(call, keys, tf.constant(values), tf.constant(slots))
    for a, b in zip(before, table.export()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_dim_mismatch_between_op_and_table_is_named():
    table = tfps.DynamicTable(4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Tfps>TableFind: dim mismatch: the op was built for dim 3 but the table has dim 4"):
        ops.tfps_table_find(table.resource_handle, tf.constant([1], tf.int64), dim=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_slots mismatch"):
        ops.tfps_table_export(table.resource_handle, 0, 10, dim=4, num_slots=2)


def test_insert_and_import_shape_errors():
    table = tfps.DynamicTable(2, optimizer="adam")
    with pytest.raises(ERRORS, match=r"values must have shape \[num_keys, dim\]"):
        table.insert(tf.constant([1, 2], tf.int64), tf.zeros([2, 5]))
    rows = tfps.TableRows(tf.constant([1], tf.int64), tf.zeros([1, 2]), tf.zeros([1, 1, 2]),
                          tf.zeros([1, 3], tf.int64))
    with pytest.raises(ERRORS, match=r"Tfps>TableImport: slots must have shape"):
        table.import_rows(rows)
    rows = rows._replace(slots=tf.zeros([1, 2, 2]), metadata=tf.zeros([1, 2], tf.int64))
    with pytest.raises(ERRORS, match=r"Tfps>TableImport: metadata must have shape \[num_keys, 4\]"):
        table.import_rows(rows)


def test_export_arguments_are_checked():
    table = tfps.DynamicTable(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"max_rows must be > 0, got 0"):
        table.export_chunk(0, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cursor must be >= 0"):
        table.export_chunk(-5, 10)


def test_step_must_be_a_scalar():
    table = tfps.DynamicTable(2)
    with pytest.raises(ERRORS, match=r"step must be a scalar|must be rank 0"):
        table.apply_gradients([1], [[1.0, 1.0]], step=[1, 2])


@pytest.mark.parametrize("kwargs,message", [
    (dict(initializer="uniform", initializer_params=[1.0, 0.0]), r"uniform needs low < high"),
    (dict(initializer="truncated_normal", initializer_params=[0.0, -1.0]), r"stddev must be > 0"),
    (dict(initializer="zeros", initializer_params=[], optimizer="adagrad", optimizer_params=[0.1]),
     r"adagrad got 1 hyperparameter values for 2 names \(initial_accumulator, epsilon\)"),
    # By name: unknown, repeated and missing names are refused, naming what the optimizer takes.
    (dict(initializer="zeros", optimizer="rmsprop", optimizer_params=[0.9, 0.0, 1e-7],
          optimizer_param_names=["rho", "momentun", "epsilon"]),
     r"rmsprop has no hyperparameter 'momentun'; it takes: rho, momentum, epsilon"),
    (dict(initializer="zeros", optimizer="rmsprop", optimizer_params=[0.9, 0.8, 1e-7],
          optimizer_param_names=["rho", "rho", "epsilon"]), r"rmsprop got hyperparameter 'rho' twice"),
    (dict(initializer="zeros", optimizer="rmsprop", optimizer_params=[0.9, 1e-7],
          optimizer_param_names=["rho", "epsilon"]), r"rmsprop needs hyperparameter 'momentum'"),
    (dict(initializer="zeros", optimizer="sgd", optimizer_params=[0.9],
          optimizer_param_names=["rho"]), r"sgd has no hyperparameter 'rho'; it takes: none"),
    (dict(initializer="zeros", optimizer="rmsprop", optimizer_params=[1.0, 0.0, 1e-7],
          optimizer_param_names=["rho", "momentum", "epsilon"]), r"rmsprop rho must be in \[0, 1\), got 1"),
    (dict(initializer="zeros", optimizer="rmsprop", optimizer_params=[0.9, 0.0, 1e-7],
          optimizer_param_names=["rho", "momentum"]), r"rmsprop got 3 hyperparameter values for 2 names"),
    (dict(initializer="zeros", optimizer="adamw"), r"unknown optimizer 'adamw'; known: sgd, adagrad, adam, ftrl, rmsprop"),
    (dict(initializer="zeros", initializer_params=[], learning_rate=-1.0), r"learning_rate must be a positive"),
    (dict(initializer="zeros", initializer_params=[], optimizer="ftrl",
          optimizer_params=[0.1, 0.0, 0.0, 0.5]), r"ftrl lr_power must be a finite number <= 0, got 0.5"),
    (dict(initializer="zeros", initializer_params=[], optimizer="adam",
          optimizer_params=[1.0, 0.999, 1e-7]), r"adam beta1 must be in \[0, 1\), got 1"),
    (dict(initializer="zeros", initializer_params=[], optimizer="adam",
          optimizer_params=[0.9, -0.1, 1e-7]), r"adam beta2 must be in \[0, 1\), got -0.1"),
    (dict(initializer="zeros", initializer_params=[], optimizer="adam",
          optimizer_params=[0.9, 0.999, -1.0]), r"adam epsilon must be a finite number >= 0"),
    (dict(initializer="zeros", initializer_params=[], optimizer="adagrad",
          optimizer_params=[0.1, float("nan")]), r"adagrad epsilon must be a finite number >= 0"),
    # A row whose gradients are all 0 keeps Adam's v and RMSprop's ms at 0: epsilon 0 is 0 / 0.
    (dict(initializer="zeros", initializer_params=[], optimizer="adam",
          optimizer_params=[0.9, 0.999, 0.0]), r"adam epsilon must be > 0 \(a row whose gradients are all 0"),
    (dict(initializer="zeros", initializer_params=[], optimizer="rmsprop",
          optimizer_params=[0.9, 0.0, 0.0]), r"rmsprop epsilon must be > 0"),
    (dict(initializer="zeros", initializer_params=[], optimizer="ftrl",
          optimizer_params=[0.1, -0.5, 0.0, -0.5]), r"ftrl l1 must be a finite number >= 0, got -0.5"),
    (dict(initializer="zeros", initializer_params=[], optimizer="ftrl",
          optimizer_params=[0.1, 0.0, float("inf"), -0.5]), r"ftrl l2 must be a finite number >= 0"),
    (dict(initializer="zeros", initializer_params=[], optimizer="ftrl",
          optimizer_params=[0.1, 0.0, 0.0, float("-inf")]), r"ftrl lr_power must be a finite number <= 0, got -inf"),
])
def test_create_op_rejects_bad_configuration(kwargs, message):
    args = dict(dim=2, optimizer="sgd", learning_rate=0.1, shared_name="bad_config_table")
    args.update(kwargs)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Tfps>TableCreate: .*" + message):
        ops.tfps_table_create(**args)


@pytest.mark.parametrize("make,message", [
    (lambda: tfps.DynamicTable(0), r"dim must be a positive int"),
    (lambda: tfps.DynamicTable(2.5), r"dim must be a positive int"),
    (lambda: tfps.DynamicTable(2, seed="x"), r"seed must be an int"),
    (lambda: tfps.DynamicTable(2, optimizer="adamw"), r"unknown tfps optimizer 'adamw'"),
    (lambda: tfps.DynamicTable(2, initializer="ones"), r"unknown tfps initializer 'ones'"),
    (lambda: tfps.optimizers.Adagrad(0.0), r"learning_rate must be a positive number"),
    (lambda: tfps.optimizers.Adam(beta_1=1.0), r"beta_1 must be in \[0, 1\)"),
    (lambda: tfps.optimizers.Adam(epsilon=0.0), r"Adam: epsilon must be a positive number"),
    (lambda: tfps.optimizers.RMSprop(epsilon=0.0), r"RMSprop: epsilon must be a positive number"),
    (lambda: tfps.optimizers.Ftrl(l1_regularization_strength=-1), r"must be >= 0"),
    (lambda: tfps.initializers.RandomUniform(1, 1), r"minval must be < maxval"),
    (lambda: tfps.initializers.TruncatedNormal(stddev=0), r"stddev must be > 0"),
])
def test_python_constructors_reject_bad_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("change,message", [
    (dict(dim=3), r"already exists with dim 2, .* not dim 3"),
    (dict(optimizer="adagrad", optimizer_params=[0.1, 1e-7]), r"optimizer sgd .* not dim 2, optimizer adagrad"),
    (dict(learning_rate=0.2), r"learning_rate 0.1\b.* not .*learning_rate 0.2"),
    (dict(initializer="uniform", initializer_params=[-1.0, 1.0]), r"initializer zeros .* initializer uniform"),
    (dict(seed=7), r"seed 0, .*not .*seed 7"),
    (dict(admission="min_count", min_count=2), r"admission none .*not .*admission min_count \(min_count 2"),
    (dict(eviction="lru", max_rows=100), r"eviction none .*not .*eviction lru .*max_rows 100"),
])
def test_same_shared_name_with_another_configuration_is_refused(change, message):
    common = dict(dim=2, optimizer="sgd", learning_rate=0.1, initializer="zeros", shared_name="dup_table")
    handle = ops.tfps_table_create(**common)
    ops.tfps_table_create(**common)  # the same configuration shares the table
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops.tfps_table_create(**{**common, **change})
    tf.raw_ops.DestroyResourceOp(resource=handle)


def test_numpy_numbers_are_accepted_like_python_ones():
    table = tfps.DynamicTable(np.int64(3), optimizer=tfps.optimizers.SGD(np.float32(0.5)), seed=np.uint64(9))
    reference = tfps.DynamicTable(3, optimizer=tfps.optimizers.SGD(0.5), seed=9)
    keys = tf.constant([1, 2], tf.int64)
    np.testing.assert_array_equal(table.find(keys).numpy(), reference.find(keys).numpy())
    layer = tfps.keras_layers.DynamicEmbedding(np.int32(2), seed=np.int64(4))
    assert layer.dim == 2 and type(layer.dim) is int and layer.get_config()["seed"] == 4
    tfps.optimizers.Adam(np.float32(0.01), beta_1=np.float64(0.8))


def test_seeds_cover_the_64_bit_space_and_nothing_past_it():
    keys = tf.constant([1, 2], tf.int64)
    top = tfps.DynamicTable(2, seed=(1 << 64) - 1, initializer="uniform")  # uint64 max
    np.testing.assert_array_equal(top.find(keys).numpy(),
                                  tfps.DynamicTable(2, seed=-1, initializer="uniform").find(keys).numpy())
    for bad in (1 << 64, -(1 << 63) - 1, 1.5, True):
        with pytest.raises(ValueError, match=r"seed must be an int in \[-2\^63, 2\^64\)"):
            tfps.DynamicTable(2, seed=bad)


def test_a_string_layer_refuses_integer_ids():
    layer = tfps.keras_layers.DynamicEmbedding(2, key_dtype=tf.string)
    for ids in (tf.constant([[7]], tf.int64), tf.constant([7], tf.int32)):
        with pytest.raises(TypeError, match=r"was made for string IDs \(key_dtype\), got int"):
            layer(ids)
    assert layer(tf.constant([["7"]])).shape == (1, 1, 2)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_a_sharded_table_takes_the_key_types_and_shapes_one_table_takes(num_shards):
    sharded = tfps.ShardedTable(2, devices=["/cpu:0"] * num_shards, initializer="uniform")
    single = tfps.DynamicTable(2, initializer="uniform")
    wide = np.array([[1, 2, 3], [4, (1 << 63) - 1, 0]], np.int64)
    for keys in (wide, wide.astype(np.int32) % 1000, wide.view(np.uint64)):
        np.testing.assert_array_equal(sharded.find(tf.constant(keys)).numpy(), single.find(tf.constant(keys)).numpy())
        rows, exists = sharded.find(tf.constant(keys), return_exists=True)
        assert rows.shape == keys.shape + (2,) and exists.shape == keys.shape
    rows = sharded.find_or_insert(tf.constant(wide.view(np.uint64)))
    assert rows.shape == (2, 3, 2) and sum(sharded.shard_sizes()) == 6
    with pytest.raises(TypeError, match="keys must be integers"):
        sharded.find(tf.constant([1.5]))


@pytest.mark.parametrize("optimizer", tfps.optimizers.OPTIMIZERS, ids=lambda c: c.op_name)
def test_an_apply_at_rate_zero_changes_nothing_or_is_refused_by_an_optimizer_dividing_by_it(optimizer):
    table = tfps.DynamicTable(2, optimizer=optimizer(0.1))
    before = table.find_or_insert([3]).numpy()
    apply = lambda: table.apply_gradients([3], [[1.0, -1.0]], learning_rate=0.0)  # noqa: E731
    if optimizer is tfps.optimizers.Ftrl:  # FTRL's update divides by the rate
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"> 0 \(ftrl divides by it\).*no row"):
            apply()
    else:
        apply()
    np.testing.assert_array_equal(table.find([3]).numpy(), before)
