"""model.fit pushes what the worker caches of a model's tables hold at the end of every
epoch, before its validation and before any of the user's callbacks run: validation,
checkpoints, backups, early stopping and exports made at an epoch's end see every gradient
the epoch computed."""

import functools

import tf_keras as keras

_CALLBACKS_POSITION = 5  # of fit(x, y, batch_size, epochs, verbose, callbacks, ...)


def cached_layers(model):
    """The model's DynamicEmbedding layers that have a worker cache."""
    from tfps.keras_layers._table_lookup import table_layers
    return [layer for layer in table_layers(model) if layer.worker_cache is not None]


class FlushWorkerCaches(keras.callbacks.Callback):
    """Pushes the layers' worker caches at each epoch's end (fit has joined its steps
    there, under ParameterServerStrategy too), at the learning rate of the step reached.
    fit's validation comes before on_epoch_end and hands evaluate fit's callbacks, so its
    on_test_begin pushes first; the epoch's end then finds the caches empty."""

    def __init__(self, layers):
        super().__init__()
        self._layers = layers

    def _push(self):
        for layer in self._layers:
            layer.flush_worker_cache(self.model.optimizer.iterations)

    def on_test_begin(self, logs=None):
        self._push()

    def on_epoch_end(self, epoch, logs=None):
        self._push()


def flushing_worker_caches(original):
    """Wraps Model.fit: a model with worker caches gets FlushWorkerCaches as its first callback."""

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        layers = cached_layers(self)
        if not layers:
            return original(self, *args, **kwargs)
        flush = FlushWorkerCaches(layers)
        if len(args) > _CALLBACKS_POSITION:
            args = list(args)
            args[_CALLBACKS_POSITION] = _first(flush, args[_CALLBACKS_POSITION], self)
        else:
            kwargs["callbacks"] = _first(flush, kwargs.get("callbacks"), self)
        return original(self, *args, **kwargs)

    return fit


def _first(callback, callbacks, model):
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callback.set_model(model)
        callbacks.callbacks.insert(0, callback)
        return callbacks
    return [callback] + list(callbacks or [])
