"""PHM-LSTM (Zhang et al. 2021, §4.1): an LSTM whose two gate projections are PHM layers.

``y_t = PHM(x_t) + PHM(h_{t−1}) + b`` split four ways into the gates (ICLR §4.1). Each projection
comes from :func:`hyperplex.nn.make_linear`, so the same class is a dense LSTM
(``LinearSpec("dense")``, identical to ``torch.nn.LSTM`` once weights are copied), a PHM-LSTM
(``LinearSpec("phm", n)``) or a quaternion LSTM (``LinearSpec("quaternion")``, Hamilton rule).

Conventions follow ``torch.nn.LSTM``:

- gate order ``i, f, g, o`` (the paper names them ``f, i, o, x'``; the order of a learned split is
  immaterial, ``nn.LSTM``'s lets weights be copied one to one);
- ``h_t = o ⊙ tanh(c_t)`` — the paper's display drops the ``tanh``, a typo: with it removed the
  unit would not be an LSTM and ``n = 1`` could not match ``nn.LSTM``;
- one bias ``b`` per layer and direction, held by the input projection (``nn.LSTM`` keeps two,
  ``b_ih`` and ``b_hh``, whose sum is the same function: :meth:`PHMLSTM.from_lstm` adds them);
- state shapes ``(num_layers · num_directions, B, H)``, dropout on the outputs of every layer but
  the last.

Speed: the input projection of a layer is one call over all time steps ``(B, T, D) → (B, T, 4H)``;
only the recurrent projection ``(B, H) → (B, 4H)`` runs inside the time loop.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from hyperplex.layers import shared_weights
from hyperplex.layers.conversion import copy_into_like, dense_weight
from hyperplex.layers.selection import DenseWeighted
from hyperplex.nn.linear import LinearSpec, make_linear
from hyperplex.nn.masks import lengths_out_of_range, lengths_to_mask

__all__ = ["PHMLSTMCell", "PHMLSTM", "reverse_padded"]

State = tuple[Tensor, Tensor]


def reverse_padded(x: Tensor, lengths: Tensor | None) -> Tensor:
    """Reverse each row of ``x`` (B, T, *) within its length; padded positions stay where they are.

    The map is an involution, so applying it twice returns ``x``.
    """
    B, T = x.shape[:2]
    if lengths is None:
        return x.flip(1)
    t = torch.arange(T, device=x.device).expand(B, T)
    lengths = lengths.to(x.device)[:, None]
    index = torch.where(t < lengths, lengths - 1 - t, t)  # (B, T)
    index = index.view(B, T, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


class PHMLSTMCell(nn.Module):
    """One LSTM layer in one direction: ``gates = W_x x + W_h h + b`` with both maps from ``make_linear``.

    Args:
        input_size: ``D``; hidden_size: ``H``.
        bias: learn ``b`` (held by :attr:`input_proj`).
        linear: the :class:`LinearSpec` of both projections (dense if ``None``).

    Attributes:
        input_proj: ``D → 4H`` (with the bias). hidden_proj: ``H → 4H`` (no bias).

    Shape:
        ``forward(x (B, D), state=(h (B, H), c (B, H)) | None) -> (h (B, H), c (B, H))``.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, linear: LinearSpec | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        linear = linear or LinearSpec()
        linear.check_divides(input_size, hidden_size, where=f"PHMLSTMCell({input_size}, {hidden_size})")
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        factory = {"device": device, "dtype": dtype}
        self.input_proj = make_linear(input_size, 4 * hidden_size, linear, bias=bias, **factory)
        self.hidden_proj = make_linear(hidden_size, 4 * hidden_size, linear, bias=False, **factory)

    def reset_parameters(self) -> None:
        """Re-initialise both projections with their own (``nn.Linear``-variance) init."""
        for proj in (self.input_proj, self.hidden_proj):
            cast(nn.Linear, proj).reset_parameters()  # every linear kind has nn.Linear's reset_parameters

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"

    def recurrence(self, input_gates: Tensor, state: State) -> State:
        """One step given the precomputed input projection ``input_gates`` (B, 4H) = ``W_x x_t + b``."""
        h, c = state
        gates = input_gates + self.hidden_proj(h)  # ICLR §4.1: PHM(x_t) + PHM(h_{t−1}) + b, (B, 4H)
        i, f, g, o = gates.chunk(4, dim=-1)  # φ: four-way split, nn.LSTM order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c

    def forward(self, input: Tensor, state: State | None = None) -> State:
        if state is None:
            zeros = input.new_zeros(input.shape[0], self.hidden_size)
            state = (zeros, zeros)
        return self.recurrence(self.input_proj(input), state)


class PHMLSTM(nn.Module):
    """Multi-layer, optionally bidirectional LSTM whose projections are PHM (or any ``LinearSpec``) maps.

    Args mirror ``torch.nn.LSTM`` (``proj_size`` is not supported) plus ``linear``, the
    :class:`LinearSpec` of every projection; ``batch_first`` defaults to ``True``.

    Cells are kept in :attr:`cells`, index ``layer · num_directions + direction`` (the order of
    ``nn.LSTM``'s state rows).

    Shape (``batch_first=True``):
        ``forward(x (B, T, D), lengths (B,) | None, state=(h_0, c_0) | None)
        -> (output (B, T, H · dirs), (h_n, c_n))`` with ``h_0, c_0, h_n, c_n``
        ``(num_layers · dirs, B, H)``. With ``lengths``, row ``b`` is read only up to ``lengths[b]``:
        the padded positions never touch the states, the backward direction starts at the last
        valid position, ``output`` is zero on padding and ``h_n, c_n`` are the states at the last
        valid step — what ``nn.LSTM`` gives on a ``pack_padded_sequence``.
    """

    conversion_error: float  # set by from_lstm: the largest relative weight error of the conversion

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True, dropout: float = 0.0, bidirectional: bool = False,
                 linear: LinearSpec | None = None, device=None, dtype=None) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"PHMLSTM num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"PHMLSTM dropout must be in [0, 1), got {dropout}")
        self.linear = linear or LinearSpec()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, dropout, bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.cells = nn.ModuleList(
            PHMLSTMCell(input_size if layer == 0 else hidden_size * self.num_directions, hidden_size, bias,
                        self.linear, device=device, dtype=dtype)
            for layer in range(num_layers) for _ in range(self.num_directions))
        self.drop = nn.Dropout(dropout)

    def reset_parameters(self) -> None:
        for cell in self.cells:
            cast(PHMLSTMCell, cell).reset_parameters()

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, bias={self.bias}, "
                f"batch_first={self.batch_first}, dropout={self.dropout}, bidirectional={self.bidirectional}, "
                f"linear={self.linear}")

    # ------------------------------------------------------------------ helpers
    def _initial_state(self, state: State | None, batch: int, like: Tensor) -> State:
        rows = self.num_layers * self.num_directions
        if state is None:
            zeros = like.new_zeros(rows, batch, self.hidden_size)
            return zeros, zeros
        h0, c0 = state
        for name, s in (("h_0", h0), ("c_0", c0)):
            if s.shape != (rows, batch, self.hidden_size):
                raise ValueError(f"PHMLSTM {name} must have shape {(rows, batch, self.hidden_size)} "
                                 f"(layers·directions, batch, hidden), got {tuple(s.shape)}")
        return h0, c0

    @staticmethod
    def _check_lengths(lengths: Tensor | None, batch: int, steps: int) -> Tensor | None:
        if lengths is None:
            return None
        lengths = torch.as_tensor(lengths)
        if lengths.shape != (batch,):
            raise ValueError(f"PHMLSTM lengths must have shape ({batch},), got {tuple(lengths.shape)}")
        if lengths_out_of_range(lengths, 0, steps):
            raise ValueError(f"PHMLSTM lengths must lie in [0, {steps}] (the time dimension), got {lengths.tolist()}")
        return lengths

    @staticmethod
    def _scan(cell: PHMLSTMCell, input_gates: Tensor, state: State, mask: Tensor | None) -> tuple[Tensor, State]:
        """Run the recurrence over ``input_gates`` (B, T, 4H); ``mask`` (B, T) freezes padded steps."""
        h, c = state
        outputs = []
        with shared_weights(cell.hidden_proj, input_gates.shape[0] * input_gates.shape[1]):
            for t in range(input_gates.shape[1]):
                h_new, c_new = cell.recurrence(input_gates[:, t], (h, c))
                if mask is None:
                    h, c = h_new, c_new
                    outputs.append(h)
                else:  # padded step: keep the state, emit zeros (as pad_packed_sequence does)
                    m = mask[:, t, None]  # (B, 1)
                    h, c = torch.where(m, h_new, h), torch.where(m, c_new, c)
                    outputs.append(h_new * m)
        return torch.stack(outputs, dim=1), (h, c)  # (B, T, H)

    # ------------------------------------------------------------------ forward
    def forward(self, input: Tensor, lengths: Tensor | None = None, state: State | None = None
                ) -> tuple[Tensor, State]:
        if input.dim() != 3 or input.shape[-1] != self.input_size:
            raise ValueError(f"PHMLSTM expects input of shape (B, T, {self.input_size}) "
                             f"(batch_first={self.batch_first}), got {tuple(input.shape)}")
        x = input if self.batch_first else input.transpose(0, 1)  # (B, T, D)
        B, T = x.shape[:2]
        lengths = self._check_lengths(lengths, B, T)
        h0, c0 = self._initial_state(state, B, x)
        mask = None
        # a batch without padding skips the mask; a compiled forward always masks (the same result, no host read)
        if lengths is not None and (torch.compiler.is_compiling() or bool((lengths < T).any())):
            lengths = lengths.to(x.device)
            mask = lengths_to_mask(lengths, T)  # (B, T)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.num_directions):
                k = layer * self.num_directions + direction
                cell = cast(PHMLSTMCell, self.cells[k])
                gates = cell.input_proj(x)  # all time steps in one call, (B, T, 4H)
                if direction == 1:
                    gates = reverse_padded(gates, lengths)
                out, (h, c) = self._scan(cell, gates, (h0[k], c0[k]), mask)
                if direction == 1:
                    out = reverse_padded(out, lengths)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            x = torch.cat(outputs, dim=-1) if self.num_directions == 2 else outputs[0]  # (B, T, H·dirs)
            if layer < self.num_layers - 1:
                x = self.drop(x)
        output = x if self.batch_first else x.transpose(0, 1)
        return output, (torch.stack(h_n), torch.stack(c_n))

    def step(self, input: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """One time step of a unidirectional stack (incremental decoding).

        Shape: ``input (B, D)``, ``state = (h, c)`` each ``(num_layers, B, H)`` or ``None`` (zeros)
        ``-> (output (B, H), (h, c))``; ``output`` is the top layer's ``h``. Equals
        ``forward(input[:, None], state=state)`` (same dropout between layers).
        """
        if self.bidirectional:
            raise ValueError("PHMLSTM.step needs a unidirectional LSTM (bidirectional=False): "
                             "the backward direction cannot run one step at a time")
        h0, c0 = self._initial_state(state, input.shape[0], input)
        x, h_n, c_n = input, [], []
        for layer, cell in enumerate(self.cells):
            h, c = cell(x, (h0[layer], c0[layer]))
            h_n.append(h)
            c_n.append(c)
            x = self.drop(h) if layer < self.num_layers - 1 else h
        return x, (torch.stack(h_n), torch.stack(c_n))

    # ------------------------------------------------------------------ conversion
    @classmethod
    def from_lstm(cls, lstm: nn.LSTM, linear: LinearSpec | None = None) -> PHMLSTM:
        """A :class:`PHMLSTM` with the weights of ``lstm``.

        Dense and ``n = 1`` specs reproduce ``lstm`` exactly (``b = b_ih + b_hh``). For ``n > 1``
        each projection is the nearest PHM map (:meth:`PHMLinear.from_linear`, or the truncated
        SVD for ``lowrank``); the largest relative weight error is stored in ``conversion_error``.
        """
        if lstm.proj_size:
            raise ValueError("PHMLSTM.from_lstm: nn.LSTM with proj_size > 0 is not supported")
        p = next(lstm.parameters())
        module = cls(lstm.input_size, lstm.hidden_size, lstm.num_layers, lstm.bias, lstm.batch_first,
                     float(lstm.dropout), lstm.bidirectional, linear, device=p.device, dtype=p.dtype)
        errors = [0.0]
        for layer in range(lstm.num_layers):
            for direction in range(module.num_directions):
                suffix = f"l{layer}" + ("_reverse" if direction else "")
                cell = module.cells[layer * module.num_directions + direction]
                bias = None
                if lstm.bias:
                    bias = getattr(lstm, f"bias_ih_{suffix}") + getattr(lstm, f"bias_hh_{suffix}")
                for name, weight, b in (("input_proj", getattr(lstm, f"weight_ih_{suffix}"), bias),
                                        ("hidden_proj", getattr(lstm, f"weight_hh_{suffix}"), None)):
                    new, error = copy_into_like(getattr(cell, name), weight.detach(), None if b is None else b.detach())
                    setattr(cell, name, new)
                    errors.append(error)
        module.conversion_error = max(errors)
        return module

    def to_lstm(self) -> nn.LSTM:
        """A ``torch.nn.LSTM`` computing the same function (dense weights ``H``, ``b_hh = 0``)."""
        p = next(self.parameters())
        lstm = nn.LSTM(self.input_size, self.hidden_size, self.num_layers, self.bias, self.batch_first,
                       self.dropout, self.bidirectional, device=p.device, dtype=p.dtype)
        with torch.no_grad():
            for layer in range(self.num_layers):
                for direction in range(self.num_directions):
                    suffix = f"l{layer}" + ("_reverse" if direction else "")
                    cell = cast(PHMLSTMCell, self.cells[layer * self.num_directions + direction])
                    input_proj = cast("nn.Linear | DenseWeighted", cell.input_proj)
                    hidden_proj = cast("nn.Linear | DenseWeighted", cell.hidden_proj)
                    getattr(lstm, f"weight_ih_{suffix}").copy_(dense_weight(input_proj))
                    getattr(lstm, f"weight_hh_{suffix}").copy_(dense_weight(hidden_proj))
                    if self.bias:
                        getattr(lstm, f"bias_ih_{suffix}").copy_(input_proj.bias)
                        getattr(lstm, f"bias_hh_{suffix}").zero_()
        return lstm
