"""Run by tests/test_metrics_pss.py in its own process: every tfps metric under an
in-process ParameterServerStrategy with 2 workers, through one Keras evaluation path (the
first argument), GroupAUC fed uint64 groups through FeedGroups; prints the metric results
and the multiset of records the workers evaluated, as JSON.

Paths: "whole" and "partitioned" (evaluate with steps=, the metric variables whole or split
over 2 PS), "exact" (evaluate with pss_evaluation_shards after a fit), "exact_fresh" (the
same on a freshly compiled model, no fit before), "validation" (fit's validation_data with
pss_evaluation_shards; the last epoch's val_ results). The exact paths first give steps
(validation_steps) over repeating data, which must be refused."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

NUM_IDS, BATCH, STEPS = 1000, 64, 24


class RecordCounts(keras.metrics.Metric):
    """Counts evaluated records by id, recovered from the prediction (id + 0.5) / NUM_IDS."""

    def __init__(self, name="record_counts", **kwargs):
        super().__init__(name=name, **kwargs)
        self.counts = self.add_weight(name="counts", shape=[NUM_IDS], dtype=tf.float64,
                                      initializer="zeros", aggregation=tf.VariableAggregation.SUM)

    def update_state(self, y_true, y_pred, sample_weight=None):
        ids = tf.cast(tf.floor(tf.reshape(y_pred, [-1]) * NUM_IDS), tf.int64)
        return self.counts.scatter_add(tf.IndexedSlices(tf.ones_like(ids, tf.float64), ids))

    def result(self):
        return tf.reduce_sum(self.counts)

    def reset_state(self):
        self.counts.assign(tf.zeros([NUM_IDS], tf.float64))


def label_of(ids):
    """A label that depends on the id (so AUC is neither 0.5 nor 1)."""
    return tf.cast(tf.math.floormod(ids * 7919, 13) < 4 + ids * 6 // NUM_IDS, tf.float32)


def group_of(ids):
    """uint64 group keys, most above 2^63, so routing them to shards must keep their bits."""
    return tf.bitcast(tf.math.floormod(ids, 37) * -0x61C8864680B583EB, tf.uint64)


def dataset_fn(_):
    ids = tf.data.Dataset.random().map(lambda r: tf.math.floormod(r, NUM_IDS))  # differs per worker
    return ids.map(lambda i: (i, label_of(i))).batch(BATCH).repeat()


def finite_dataset_fn(_):
    """Every id once, the same on every worker: exact evaluation shards it by batch."""
    ids = tf.data.Dataset.range(NUM_IDS)
    return ids.map(lambda i: (i, label_of(i))).batch(BATCH)


def main():
    # "partitioned": the metric variables are split over 2 PS by a variable partitioner;
    # "exact": evaluate with pss_evaluation_shards, every record once, after a fit.
    path = sys.argv[1]
    partitioned = path == "partitioned"
    exact = path in ("exact", "exact_fresh", "validation")
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2) if partitioned else None
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2 if partitioned else 1,
                                       variable_partitioner=partitioner) as strategy:
        with strategy.scope():
            ids = keras.Input(shape=(), dtype=tf.int64)
            prediction = keras.layers.Lambda(
                lambda i: (tf.cast(i, tf.float32) + 0.5) / NUM_IDS)(ids)
            group_auc = tfps.metrics.GroupAUC(name="group_auc")
            groups = keras.layers.Lambda(group_of)(ids)
            model = keras.Model(ids, tfps.metrics.FeedGroups(group_auc)([prediction, groups]))
            counts = RecordCounts()
            auc = tfps.metrics.AUC(name="auc")
            model.compile(loss="binary_crossentropy",
                          metrics=[auc, tfps.metrics.AUC(curve="PR", name="pr_auc"), counts, group_auc,
                                   tfps.metrics.BinaryLogLoss(), tfps.metrics.CalibrationRatio()],
                          pss_evaluation_shards=4 if exact else 0)
        every_id_once = keras.utils.experimental.DatasetCreator(finite_dataset_fn)
        refusal = steps_run_before_refusal = few_batches_refusal = validation_refusal = None
        if exact:  # steps over repeating data: exact evaluation would ignore them and never end
            repeating = keras.utils.experimental.DatasetCreator(dataset_fn)
            try:
                if path == "validation":
                    model.fit(repeating, epochs=1, steps_per_epoch=2, validation_data=repeating,
                              validation_steps=3, verbose=0)
                else:
                    model.evaluate(repeating, steps=3, verbose=0)
            except ValueError as e:
                refusal = str(e)
            steps_run_before_refusal = int(model._train_counter.numpy())  # pylint: disable=protected-access
            # 2 batches for 4 shards: a shard without a batch would fail inside tf.data.
            two_batches = finite_dataset_fn(None).take(2)
            try:
                if path == "validation":
                    model.fit(repeating, epochs=1, steps_per_epoch=2, validation_data=two_batches, verbose=0)
                else:
                    model.evaluate(two_batches, verbose=0)
            except ValueError as e:
                few_batches_refusal = str(e)
        if path == "validation":
            history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=2,
                                validation_data=every_id_once, verbose=0).history
            results = {name[len("val_"):]: values[-1] for name, values in history.items() if name.startswith("val_")}
        elif exact:
            if path == "exact":
                # A fit first (the model has no weights to change), so evaluate follows a fit.
                model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=2,
                          verbose=0)
            results = model.evaluate(every_id_once, return_dict=True, verbose=0)
        else:
            try:  # a dataset and no steps: read until steps batches, of which there are none
                model.evaluate(finite_dataset_fn(None).take(2), verbose=0)
            except ValueError as e:
                refusal = str(e)
            try:  # the same as fit's validation, refused before fit's first step
                model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=2,
                          validation_data=finite_dataset_fn(None).take(2), verbose=0)
            except ValueError as e:
                validation_refusal = str(e)
            steps_run_before_refusal = int(model._train_counter.numpy())  # pylint: disable=protected-access
            results = model.evaluate(keras.utils.experimental.DatasetCreator(dataset_fn), steps=STEPS,
                                     return_dict=True, verbose=0)
        record_counts = tf.concat([tf.convert_to_tensor(v) for v in
                                   getattr(counts.counts, "variables", [counts.counts])], 0).numpy().tolist()
        auc_parts = len(getattr(auc.histogram, "variables", [None]))
        group_shards = group_auc.histograms.num_shards
        group_buckets = [group_auc.buckets_per_octave, group_auc.octaves]
    result_types = sorted({type(value).__name__ for value in results.values()})
    results = {name: float(value) for name, value in results.items()}
    json.dump({"results": results, "record_counts": record_counts,
               "steps": -(-NUM_IDS // BATCH) if exact else STEPS, "batch": BATCH,
               "auc_histogram_parts": auc_parts, "group_auc_shards": group_shards,
               "group_auc_buckets": group_buckets, "refusal": refusal, "few_batches_refusal": few_batches_refusal,
               "validation_refusal": validation_refusal, "result_types": result_types,
               "steps_run_before_refusal": steps_run_before_refusal},
              sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # in-process servers cannot be stopped; end the process without waiting


if __name__ == "__main__":
    main()
