"""Models: translators (LSTM + Luong attention, Transformer family) and classifiers.

Import the model modules directly (``hyperplex.models.transformer``); the config → class mapping
is :mod:`hyperplex.config.registry`.
"""
