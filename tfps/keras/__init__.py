"""What ties the tables to tf_keras: the optimizer bridge that applies a table's gradient
in the Keras optimizer's step, gradient accumulation, Keras saving, exact evaluation, the
Keras 3 guard, the patches of tf_keras and TensorFlow, the callbacks and the serving
export. The layer is tfps.keras_layers; the metrics are tfps.metrics."""
