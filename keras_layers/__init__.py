"""Keras layers of tfps, installed as `tfps.keras_layers`."""

from tfps.keras_layers.dynamic_embedding import DynamicEmbedding

__all__ = ["DynamicEmbedding"]
