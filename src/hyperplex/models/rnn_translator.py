"""The LSTM + attention translator of the thesis (002, ch. 3; Luong et al. 2015).

Embeddings → (bi-)LSTM encoder → uni-LSTM decoder with Luong attention:

- ``h_t``: top decoder state; ``c_t``, ``a_t``: context and weights from
  :mod:`hyperplex.nn.luong` (global dot/general/concat, local-m, local-p, or none);
- ``h̃_t = tanh(W_c [c_t; h_t])`` (thesis eq. 3.4), ``p(y_t | y_<t, x) = softmax(W_s h̃_t)``
  (eq. 3.5). Without attention (the baseline) ``h̃_t = h_t``;
- input feeding (thesis §3.5, eq. 3.10): the decoder input at step t is ``[y_{t−1}; h̃_{t−1}]``,
  with ``h̃_{−1} = 0``;
- reversed source (thesis §4.1): each source row is reversed within its length before encoding.
  The encoder outputs are put back in source order, so attention weights (and ``<unk>``
  replacement) always refer to source positions as given.

Encoder → decoder bridge: a bidirectional encoder has ``hidden_size / 2`` units per direction
(thesis §4.1: 1000 = 2 × 500), so its outputs are ``hidden_size`` wide and each layer's final
forward and backward states are **concatenated** (``[h_fwd; h_bwd]``) into a decoder state — no
extra parameters. Decoder layer ``i`` counted from the top starts from encoder layer ``i``
counted from the top; decoder layers without a partner (more decoder than encoder layers) start
at zero.

Every matrix — the LSTM projections, the attention maps, ``W_c`` and the vocabulary projection
``W_s`` — comes from :func:`make_linear` with ``config.linear``, so a PHM-LSTM translator is one
config switch. ``dense_output_layer`` keeps ``W_s`` dense (needed when ``n`` does not divide the
vocabulary size); ``tie_embeddings`` makes ``W_s`` the target embedding matrix (dense, needs
``embedding_dim == hidden_size``). Embedding tables are lookups, not linear maps, and stay dense.

Dropout (``config.dropout``) is applied to the embeddings, between LSTM layers and to ``h̃_t``
before ``W_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.config.registry import ModelConfig
from hyperplex.layers import shared_weights
from hyperplex.nn.linear import LinearSpec, make_linear
from hyperplex.nn.luong import ATTENTIONS, make_attention
from hyperplex.nn.masks import lengths_out_of_range, lengths_to_mask
from hyperplex.nn.rnn import PHMLSTM, reverse_padded

__all__ = ["RNNTranslatorConfig", "RNNTranslator"]


@dataclass
class RNNTranslatorConfig(ModelConfig):
    """Hyper-parameters of :class:`RNNTranslator` (thesis defaults in the ``help`` texts)."""

    embedding_dim: int = field(default=256, metadata={"help": "word embedding size (thesis: 1000); default 256"})
    hidden_size: int = field(default=256, metadata={
        "help": "decoder / attention size; a bidirectional encoder uses hidden_size/2 per direction "
                "(thesis: 1000); default 256"})
    encoder_layers: int = field(default=2, metadata={"help": "encoder LSTM layers (thesis: 4); default 2"})
    decoder_layers: int = field(default=2, metadata={"help": "decoder LSTM layers (thesis: 4); default 2"})
    bidirectional_encoder: bool = field(default=True, metadata={
        "help": "bi-LSTM encoder (thesis) instead of a uni-LSTM; default true"})
    dropout: float = field(default=0.2, metadata={
        "help": "dropout on embeddings, between LSTM layers and on the attentional state (thesis: 0.2); default 0.2"})
    attention: str = field(default="general", metadata={
        "help": "none | dot | general | concat | local-m | local-p (any key of hyperplex.nn.luong.ATTENTIONS); "
                "default general"})
    window: int = field(default=10, metadata={"help": "half-width D of the local-m/local-p window, σ = D/2; "
                                                      "default 10"})
    local_p_normalize: bool = field(default=True, metadata={
        "help": "renormalise local-p weights after the Gaussian so they sum to 1 (false: Luong eq. 3.9 literally); "
                "default true"})
    input_feeding: bool = field(default=True, metadata={
        "help": "feed h̃_{t-1} into the decoder input at step t (thesis §3.5); default true"})
    reverse_source: bool = field(default=False, metadata={
        "help": "reverse each source sentence's words before encoding, a closing </s> staying last (thesis "
                "§4.1 does); default false"})
    tie_embeddings: bool = field(default=False, metadata={
        "help": "share the target embedding matrix with the (dense) output projection; needs "
                "embedding_dim == hidden_size; default false"})
    dense_output_layer: bool = field(default=False, metadata={
        "help": "keep the vocabulary projection W_s dense even when `linear` is PHM (set when n does not "
                "divide the vocabulary size); default false"})
    linear: LinearSpec = field(default_factory=LinearSpec, metadata={
        "help": "kind of every linear map (LSTM gates, attention, W_c, W_s): dense | phm | quaternion | lowrank"})

    def __post_init__(self) -> None:
        if isinstance(self.linear, dict):  # convenience for hand-written dicts
            self.linear = LinearSpec(**self.linear)
        if self.attention not in ATTENTIONS:
            raise ValueError(f"RNNTranslatorConfig.attention: unknown {self.attention!r}; valid: "
                             f"{', '.join(ATTENTIONS)}")
        for name in ("embedding_dim", "hidden_size", "encoder_layers", "decoder_layers", "window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RNNTranslatorConfig.{name} must be a positive integer, got {value!r}")
        if self.bidirectional_encoder and self.hidden_size % 2:
            raise ValueError(f"RNNTranslatorConfig.hidden_size must be even with bidirectional_encoder "
                             f"(hidden_size/2 units per direction), got {self.hidden_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"RNNTranslatorConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.tie_embeddings and self.embedding_dim != self.hidden_size:
            raise ValueError(f"RNNTranslatorConfig.tie_embeddings needs embedding_dim == hidden_size, "
                             f"got {self.embedding_dim} and {self.hidden_size}")
        # Sizes that linear.n must divide, checked here (at config load) rather than after the data is read.
        encoder_hidden = self.hidden_size // 2 if self.bidirectional_encoder else self.hidden_size
        decoder_input = self.embedding_dim + (self.hidden_size if self.input_feeding else 0)
        self.linear.check_divides(self.embedding_dim, self.hidden_size, encoder_hidden, decoder_input,
                                  where="model.embedding_dim / model.hidden_size (halved per direction when "
                                        "bidirectional_encoder; + embedding_dim with input_feeding)")


class RNNTranslator(nn.Module):
    """LSTM encoder–decoder with Luong attention implementing the seq2seq protocol.

    Shapes: ``src (B, S)``, ``src_lengths (B,)``, ``tgt_in (B, T)`` (starts with BOS), ``H`` =
    ``config.hidden_size``, ``V`` = ``tgt_vocab_size``.

    - ``forward(src, src_lengths, tgt_in) -> logits (B, T, V)`` (teacher forcing);
    - ``encode(src, src_lengths) -> state`` with ``memory (B, S, H)``, ``mask (B, S)``,
      ``src_lengths (B,)``, ``hidden``/``cell`` ``(B, decoder_layers, H)``, ``feed (B, H)``
      (input feeding) and ``keys (B, S, H)`` (attention precomputation) — batch first everywhere;
    - ``decode_step(prev_tokens (B,), state, step) -> (log_probs (B, V), state, weights (B, S) | None)``.
    """

    def __init__(self, config: RNNTranslatorConfig, src_vocab_size: int, tgt_vocab_size: int, *,
                 pad_index: int = 0, unk_index: int = 1, bos_index: int = 2, eos_index: int = 3) -> None:
        super().__init__()
        c = self.config = config
        self.pad_index, self.unk_index, self.bos_index, self.eos_index = pad_index, unk_index, bos_index, eos_index
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        H, E, spec = c.hidden_size, c.embedding_dim, c.linear
        encoder_hidden = H // 2 if c.bidirectional_encoder else H
        decoder_input = E + (H if c.input_feeding else 0)
        dense_output = c.tie_embeddings or c.dense_output_layer
        if not dense_output and spec.needs_divisible and tgt_vocab_size % spec.num_components:
            raise ValueError(f"RNNTranslator: linear n={spec.num_components} does not divide the target vocabulary "
                             f"size {tgt_vocab_size}; set dense_output_layer: true or pad the vocabulary")

        self.src_embed = nn.Embedding(src_vocab_size, E, padding_idx=pad_index)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, E, padding_idx=pad_index)
        self.encoder = PHMLSTM(E, encoder_hidden, c.encoder_layers, dropout=c.dropout,
                               bidirectional=c.bidirectional_encoder, linear=spec)
        self.decoder = PHMLSTM(decoder_input, H, c.decoder_layers, dropout=c.dropout, linear=spec)
        self.attention = make_attention(c.attention, H, H, spec, c.window, c.local_p_normalize)
        # W_c of eq. 3.4 (no bias, as Luong et al.)
        self.combine = make_linear(2 * H, H, spec, bias=False) if self.attention is not None else None
        if dense_output:
            self.output_layer: nn.Module = nn.Linear(H, tgt_vocab_size, bias=not c.tie_embeddings)
            if c.tie_embeddings:
                self.output_layer.weight = self.tgt_embed.weight
        else:
            self.output_layer = make_linear(H, tgt_vocab_size, spec)  # W_s of eq. 3.5
        self.drop = nn.Dropout(c.dropout)

    def extra_repr(self) -> str:
        return f"src_vocab={self.src_vocab_size}, tgt_vocab={self.tgt_vocab_size}, attention={self.config.attention!r}"

    # ------------------------------------------------------------------ encoder
    def _check_source(self, src: Tensor, src_lengths: Tensor) -> None:
        if src.dim() != 2:
            raise ValueError(f"RNNTranslator: src must be (B, S) token ids, got shape {tuple(src.shape)}")
        if src_lengths.shape != (src.shape[0],):
            raise ValueError(f"RNNTranslator: src_lengths must have shape ({src.shape[0]},), "
                             f"got {tuple(src_lengths.shape)}")
        if lengths_out_of_range(src_lengths, 1, src.shape[1]):
            raise ValueError(f"RNNTranslator: src_lengths must lie in [1, {src.shape[1]}], got {src_lengths.tolist()}")

    def _bridge(self, final: Tensor) -> Tensor:
        """Encoder final states ``(Le·dirs, B, He)`` → decoder initial states ``(Ld, B, H)`` (module doc)."""
        Le, Ld = self.config.encoder_layers, self.config.decoder_layers
        dirs = self.encoder.num_directions
        B = final.shape[1]
        final = final.view(Le, dirs, B, -1).permute(0, 2, 1, 3).reshape(Le, B, -1)  # [fwd; bwd], (Le, B, H)
        if Le >= Ld:
            return final[Le - Ld:]
        return torch.cat([final.new_zeros(Ld - Le, B, final.shape[-1]), final])

    def encode(self, src: Tensor, src_lengths: Tensor) -> dict[str, Tensor]:
        """Run the encoder; returns the decoder's initial state (see class doc), batch on dim 0."""
        src_lengths = src_lengths.to(src.device)
        self._check_source(src, src_lengths)
        mask = lengths_to_mask(src_lengths, src.shape[1])  # (B, S)
        words = src_lengths
        if self.config.reverse_source:
            # the words are reversed and a closing </s> stays last, the end-of-input marker (Sutskever et al.)
            last = src.gather(1, (src_lengths - 1).clamp(min=0)[:, None])[:, 0]
            words = src_lengths - (last == self.eos_index).long()
        tokens = reverse_padded(src, words) if self.config.reverse_source else src
        memory, (h, c) = self.encoder(self.drop(self.src_embed(tokens)), src_lengths)  # (B, S, H)
        if self.config.reverse_source:
            memory = reverse_padded(memory, words)  # back to source order
        state = {"memory": memory, "mask": mask, "src_lengths": src_lengths,
                 "hidden": self._bridge(h).transpose(0, 1), "cell": self._bridge(c).transpose(0, 1)}  # (B, Ld, H)
        if self.config.input_feeding:
            state["feed"] = memory.new_zeros(src.shape[0], self.config.hidden_size)
        if self.attention is not None:
            state["keys"] = self.attention.keys(memory)
        return state

    # ------------------------------------------------------------------ decoder
    def _attend(self, h: Tensor, state: dict[str, Tensor], step: int) -> tuple[Tensor, Tensor | None]:
        """``h (B, [T,] H) -> (h̃ (B, [T,] H), weights (B, [T,] S) | None)`` (eq. 3.4)."""
        if self.attention is None or self.combine is None:  # both or neither
            return h, None
        context, weights = self.attention(h, state["memory"], state["mask"], step, state["src_lengths"], state["keys"])
        return torch.tanh(self.combine(torch.cat([context, h], dim=-1))), weights

    def decode_step(self, prev_tokens: Tensor, state: dict[str, Tensor], step: int
                    ) -> tuple[Tensor, dict[str, Tensor], Tensor | None]:
        """One decoder step: ``prev_tokens (B,)`` (BOS at step 0) → ``log_probs (B, V)``, new state, weights."""
        x = self.drop(self.tgt_embed(prev_tokens))  # (B, E)
        if self.config.input_feeding:
            x = torch.cat([x, state["feed"]], dim=-1)  # eq. 3.10
        h, (hidden, cell) = self.decoder.step(x, (state["hidden"].transpose(0, 1), state["cell"].transpose(0, 1)))
        attentional, weights = self._attend(h, state, step)
        log_probs = F.log_softmax(self.output_layer(self.drop(attentional)).float(), dim=-1)
        state = dict(state, hidden=hidden.transpose(0, 1), cell=cell.transpose(0, 1))
        if self.config.input_feeding:
            state["feed"] = attentional
        return log_probs, state, weights

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, T, V)`` for ``tgt_in (B, T)``."""
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"RNNTranslator: tgt_in must be (B, T) with B = {src.shape[0]}, got {tuple(tgt_in.shape)}")
        state = self.encode(src, src_lengths)
        embedded = self.drop(self.tgt_embed(tgt_in))  # (B, T, E)
        initial = (state["hidden"].transpose(0, 1), state["cell"].transpose(0, 1))
        if not self.config.input_feeding:
            # No feedback from h̃: the whole target runs through the LSTM (input projection in one
            # call) and attention handles all T queries at once.
            h, _ = self.decoder(embedded, state=initial)  # (B, T, H)
            attentional, _ = self._attend(h, state, 0)
        else:
            # Step by step (h̃_{t−1} feeds step t); every PHM map of the decoder and attention
            # forms its H once for the T steps instead of once per step.
            feed, lstm_state, outputs = state["feed"], initial, []
            with shared_weights((self.decoder, self.attention, self.combine), tgt_in.shape[0] * tgt_in.shape[1]):
                for t in range(tgt_in.shape[1]):
                    h, lstm_state = self.decoder.step(torch.cat([embedded[:, t], feed], dim=-1), lstm_state)
                    feed, _ = self._attend(h, state, t)
                    outputs.append(feed)
            attentional = torch.stack(outputs, dim=1)  # (B, T, H)
        return self.output_layer(self.drop(attentional))
