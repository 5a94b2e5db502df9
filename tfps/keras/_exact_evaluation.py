"""Exact evaluation (compile's pss_evaluation_shards) of a model that has not run a step.

tf_keras builds a model's compiled metrics (and loss) at its first train or test step, but its exact
evaluation under ParameterServerStrategy clones them before any step runs: a freshly
compiled or freshly loaded model's evaluate fails there with "'NoneType' object is not
iterable", whatever its metrics. tfps.keras._patches builds them first, from the outputs of a model
whose outputs are known (functional and Sequential models); other models get an error that
says what to run first.

Exact evaluation also runs one step per shard, each reading its shard to the end, and
ignores evaluate's `steps` (fit's `validation_steps`): over a repeating dataset it never
returns. tfps refuses `steps` there, naming both ways out. A dataset of fewer batches
than shards leaves a shard empty, which fails inside tf.data with a message about file
sharding: tfps refuses it first when the dataset's length is known. Without exact
evaluation, a tf.data.Dataset and no steps is read until no number of batches, which ends
in a raw CancelledError (finite data) or never (repeating data): refused too.
"""

import functools
import inspect

import tensorflow as tf
from tf_keras.src.utils import tf_utils


def _build_compiled_metrics(model):
    metrics, loss = getattr(model, "compiled_metrics", None), getattr(model, "compiled_loss", None)
    if metrics is None or metrics.built and (loss is None or loss.built):
        return
    outputs = getattr(model, "_nested_outputs", None)
    if outputs is None:
        raise ValueError(
            f"evaluate with pss_evaluation_shards: the compiled metrics of model '{model.name}' are "
            "made at its first step, and its outputs are not known before one runs; run a fit or "
            "an evaluate with steps= first, or compile with pss_evaluation_shards=0")
    # Labels take the predictions' structure, as Keras assumes when it builds them itself.
    if not metrics.built:
        metrics.build(outputs, outputs)
    if loss is not None and not loss.built:
        loss.build(outputs)


def building_metrics_first(make_test_function_exact):
    """Model._make_test_function_exact (tfps.keras._patches)."""
    def make(self):
        _build_compiled_metrics(self)
        return make_test_function_exact(self)
    return make


def with_python_numbers(aggregate_exact_metrics):
    """Model._aggregate_exact_metrics (tfps.keras._patches): exact evaluation's results as
    Python numbers (arrays for metrics of more than one value), as every other evaluation
    gives them. tf_keras returns the metrics' tensors there, which reach evaluate's caller
    and the callbacks' on_test_end."""
    @functools.wraps(aggregate_exact_metrics)
    def aggregate(self, logs):
        # The conversion tf_keras gives every other evaluation's results.
        return tf_utils.sync_to_numpy_or_python_type(aggregate_exact_metrics(self, logs))

    return aggregate


def _on_workers(model):
    """Whether the model evaluates through a ClusterCoordinator (ParameterServerStrategy),
    as tf_keras decides it (Model._get_test_function_runner)."""
    return model.distribute_strategy._should_use_with_coordinator  # pylint: disable=protected-access


def _refuse_steps(model, name, steps):
    shards = getattr(model, "_pss_evaluation_shards", 0)
    if steps is not None and shards and _on_workers(model):
        raise ValueError(
            f"model '{model.name}' is compiled with pss_evaluation_shards={shards}, so under "
            f"ParameterServerStrategy evaluation reads every shard of the data to its end and {name}={steps} "
            "would be ignored (over a repeating dataset it would never end): give finite data and no "
            f"{name}, or compile with pss_evaluation_shards=0 to evaluate {name} batches")


def _refuse_endless_or_failing(model, name, steps_name, steps, data):
    """Without exact evaluation a tf.data.Dataset under ParameterServerStrategy is read
    until `steps` batches: with none given, finite data ends in tf.data's "End of
    sequence" and a raw CancelledError, and repeating data never ends."""
    if (steps is None and not getattr(model, "_pss_evaluation_shards", 0)
            and isinstance(data, tf.data.Dataset) and _on_workers(model)):
        raise ValueError(
            f"{name}: under ParameterServerStrategy model '{model.name}' evaluates a tf.data.Dataset "
            f"by reading a given number of its batches, and {steps_name}=None gives none (finite "
            "data would end in tf.data's 'End of sequence', repeating data never); give "
            f"{steps_name}=N, or compile with pss_evaluation_shards=<number of workers> to evaluate "
            "every example of finite data once")


def _refuse_fewer_batches_than_shards(model, name, data):
    """A shard left without a batch fails inside tf.data with "Could not apply FILE based
    sharding", whatever the dataset's sharding policy: refused here, where the numbers
    are known (a tf.data.Dataset of known length)."""
    shards = getattr(model, "_pss_evaluation_shards", 0)
    if not (shards and isinstance(data, tf.data.Dataset) and _on_workers(model)):
        return
    batches = int(data.cardinality())
    if batches == 0:
        raise ValueError(f"{name} has no batches: there is nothing for model '{model.name}' to evaluate")
    if 0 < batches < shards:
        raise ValueError(
            f"{name} has {batches} batches, fewer than the {shards} shards that exact evaluation "
            f"(pss_evaluation_shards, 'auto' being 5 per worker) splits it into, and a shard "
            f"without a batch fails inside tf.data; compile model '{model.name}' with "
            f"pss_evaluation_shards of at most {batches} (the number of workers is enough), or "
            "evaluate more batches")


def refusing_steps(evaluate):
    """Model.evaluate (tfps.keras._patches)."""
    signature = inspect.signature(evaluate)

    @functools.wraps(evaluate)
    def wrapped(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        _refuse_steps(self, "steps", arguments.get("steps"))
        _refuse_endless_or_failing(self, "evaluate", "steps", arguments.get("steps"), arguments.get("x"))
        _refuse_fewer_batches_than_shards(self, "evaluate's data", arguments.get("x"))
        return evaluate(self, *args, **kwargs)

    return wrapped


def refusing_validation_steps(fit):
    """Model.fit (tfps.keras._patches): refused before the first step, where a refusal inside
    fit's validation would leave tf_keras' cached validation data behind."""
    signature = inspect.signature(fit)

    @functools.wraps(fit)
    def wrapped(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        if arguments.get("validation_data") is not None:
            _refuse_steps(self, "validation_steps", arguments.get("validation_steps"))
            _refuse_endless_or_failing(self, "fit's validation_data", "validation_steps",
                                       arguments.get("validation_steps"), arguments["validation_data"])
            _refuse_fewer_batches_than_shards(self, "validation_data", arguments["validation_data"])
        return fit(self, *args, **kwargs)

    return wrapped
