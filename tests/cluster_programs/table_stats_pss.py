"""Run by tests/test_table_stats.py: TableStats(every_n_steps=N) under an in-process
ParameterServerStrategy (2 workers, 2 PS), for the steps_per_execution and N given as
arguments (pairs); every batch holds BATCH IDs never seen before, so after step s the table
holds exactly BATCH * s rows whichever worker ran the step. Prints, per pair, the rows
TensorBoard received by step, as JSON."""

import glob
import json
import os
import sys
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

BATCH, STEPS_PER_EPOCH, EPOCHS = 10, 20, 2


def dataset_fn(_):
    # 64-bit random IDs: a repeat among a few hundred has probability about 2^-48.
    return tf.data.Dataset.random().map(lambda r: (r, 0.0)).batch(BATCH)


def scalars(log_dir, tag):
    """[step, value] of every point written for `tag`, in order."""
    found = []
    for path in sorted(glob.glob(f"{log_dir}/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    found.append([event.step, float(tf.make_ndarray(value.tensor))])
    return found


def main():
    pairs = [tuple(int(n) for n in pair.split(",")) for pair in sys.argv[1:]]
    results = []
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        for steps_per_execution, every in pairs:
            with strategy.scope():
                ids = keras.Input((), dtype=tf.int64)
                layer = tfps.keras_layers.DynamicEmbedding(4, name="users")
                model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
                model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
            log_dir = tempfile.mkdtemp(prefix="tfps-table-stats-")
            history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=EPOCHS,
                                steps_per_epoch=STEPS_PER_EPOCH, verbose=0,
                                callbacks=[tfps.callbacks.TableStats(log_dir, every_n_steps=every)]).history
            results.append({"steps_per_execution": steps_per_execution, "every": every,
                            "history_rows": history["users/rows"], "summaries": scalars(log_dir, "users/rows")})
    json.dump({"batch": BATCH, "results": results}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # in-process servers cannot be stopped; end the process without waiting


if __name__ == "__main__":
    main()
