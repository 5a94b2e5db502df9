"""Keras layers of tfps, installed as `tfps.keras_layers`."""
