"""Building blocks: the linear-map factory, recurrent cells, attention and Transformer stacks."""

from hyperplex.nn.linear import LINEAR_KINDS, LinearSpec, make_linear

__all__ = ["LINEAR_KINDS", "LinearSpec", "make_linear"]
