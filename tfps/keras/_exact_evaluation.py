"""Exact evaluation (compile's pss_evaluation_shards) of a model that has not run a step.

tf_keras builds a model's compiled metrics (and loss) at its first train or test step, but its exact
evaluation under ParameterServerStrategy clones them before any step runs: a freshly
compiled or freshly loaded model's evaluate fails there with "'NoneType' object is not
iterable", whatever its metrics. tfps.keras._patches builds them first, from the outputs of a model
whose outputs are known (functional and Sequential models); other models get an error that
says what to run first.
"""


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
