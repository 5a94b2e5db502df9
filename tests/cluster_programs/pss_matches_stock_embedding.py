"""Run by tests/test_dynamic_embedding_pss.py: one worker, two PS. Trains a DynamicEmbedding
model (table sharded over both PS) and the same model on a stock Keras Embedding whose rows
start from the table's initial values, on the same batches, through model.fit; prints both
models' embedding rows and output kernels (with one worker the steps run in order, so the
two must agree exactly), and which key tensors a traced step of the tfps model sends each PS.

Usage: pss_matches_stock_embedding.py OPTIMIZER STEPS_PER_EXECUTION, OPTIMIZER one of
legacy-adagrad (keras.optimizers.legacy.Adagrad), legacy-rmsprop (with momentum, which
TensorFlow's sparse kernel applies) or sgd (the current keras.optimizers.SGD);
the table's optimizer is tfps' of the same kind."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

BATCH, FIELDS, DIM, VOCAB, STEPS = 64, 3, 4, 20, 30


def batches(_):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(STEPS, BATCH, FIELDS)).astype(np.int64)
    dense = rng.random((STEPS, BATCH, 2)).astype(np.float32)
    labels = (rng.random((STEPS, BATCH)) < 0.4).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(((dense, ids), labels)).repeat()


OPTIMIZERS = {
    "legacy-adagrad": (lambda: tfps.optimizers.Adagrad(0.2),
                       lambda: keras.optimizers.legacy.Adagrad(0.2)),
    "legacy-rmsprop": (lambda: tfps.optimizers.RMSprop(0.05, momentum=0.5),
                       lambda: keras.optimizers.legacy.RMSprop(0.05, momentum=0.5)),
    "sgd": (lambda: tfps.optimizers.SGD(0.5), lambda: keras.optimizers.SGD(0.5)),
}


def build(embedding_kind, strategy, optimizer, steps_per_execution):
    table_optimizer, keras_optimizer = OPTIMIZERS[optimizer]
    with strategy.scope():
        dense_in = keras.Input((2,))
        ids_in = keras.Input((FIELDS,), dtype=tf.int64)
        if embedding_kind == "tfps":
            layer = tfps.keras_layers.DynamicEmbedding(DIM, optimizer=table_optimizer())
            embedded = layer(ids_in, namespace="columns")
        else:
            layer = keras.layers.Embedding(FIELDS * VOCAB, DIM)
            embedded = layer(ids_in + tf.range(FIELDS, dtype=tf.int64) * VOCAB)
        x = keras.layers.Concatenate()([keras.layers.Flatten()(embedded), dense_in])
        output = keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones")(x)
        model = keras.Model([dense_in, ids_in], output)
        model.compile(optimizer=keras_optimizer(), loss="binary_crossentropy",
                      steps_per_execution=steps_per_execution)
    return model, layer


def keys_sent_by_device(strategy, model):
    """{PS device: {table op: [the tensors it takes as keys]}} in a traced step of `model`
    (lookup and update): whether the update sends a PS the tensor its lookup sent."""
    @tf.function
    def step(features, labels):
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = model.compiled_loss(labels, model(features, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        strategy.run(replica_step, (features, labels))

    graph = step.get_concrete_function(
        (tf.TensorSpec([None, 2]), tf.TensorSpec([None, FIELDS], tf.int64)), tf.TensorSpec([None])).graph
    sent = {}
    for op in graph.get_operations():
        if op.type in ("Tfps>TableFindOrInsert", "Tfps>TableApplyGradients"):
            sent.setdefault(op.device, {}).setdefault(op.type, []).append(op.inputs[1].name)
    return sent


def main():
    optimizer, steps_per_execution = sys.argv[1], int(sys.argv[2])
    with tfps.distribute.local_cluster(num_workers=1, num_ps=2) as strategy:
        ours, table_layer = build("tfps", strategy, optimizer, steps_per_execution)
        stock, embedding_layer = build("stock", strategy, optimizer, steps_per_execution)
        # Row f * VOCAB + i of the stock table is ID i of field f, key namespaced by f + 1.
        field = np.repeat(np.arange(FIELDS), VOCAB)
        ids = np.tile(np.arange(VOCAB), FIELDS)
        keys = tfps.keys.ids_to_keys(tf.constant(ids, tf.int64), tf.constant(field + 1, tf.int64))
        initial = table_layer.table.find(keys)
        embedding_layer.embeddings.assign(initial)
        for model in (ours, stock):
            model.fit(keras.utils.experimental.DatasetCreator(batches), epochs=1, steps_per_epoch=STEPS,
                      verbose=0)
        json.dump({"initial": initial.numpy().tolist(),
                   "tfps_rows": table_layer.table.find(keys).numpy().tolist(),
                   "stock_rows": embedding_layer.embeddings.numpy().tolist(),
                   "tfps_kernel": ours.layers[-1].kernel.numpy().tolist(),
                   "stock_kernel": stock.layers[-1].kernel.numpy().tolist(),
                   "table_shards": table_layer.table.num_shards,
                   "keys_sent_by_device": keys_sent_by_device(strategy, ours)},
                  sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # in-process servers cannot be stopped; end the process without waiting


if __name__ == "__main__":
    main()
