"""Decoding for every translator of the seq2seq protocol: greedy search, batched beam search with
the Wu et al. (2016) length penalty, and attention-based ``<unk>`` replacement (thesis §3.6).

A model needs ``encode(src, src_lengths) -> state`` (tensors with the batch on dim 0, possibly in
nested lists/tuples/dicts), ``decode_step(prev (B,), state, step) -> (log_probs (B, V), state,
attention (B, S) | None)`` and ``bos_index``/``eos_index``. Search runs under ``torch.no_grad()``
and does not change ``model.training`` (call ``model.eval()`` first).

Search never emits ``<s>`` or ``<pad>`` (the model's ``bos_index`` / ``pad_index``): their
log-probabilities are set to ``-inf`` before a token is chosen, so an undertrained model that
ranks them first emits its next-best token instead — often ``</s>`` — rather than an empty
sentence ``max_output_length`` tokens long. ``<unk>`` stays (``replace_unk`` needs it), and so
does ``</s>``. Scores stay the model's own log-probabilities (not renormalised over the allowed
tokens). A model whose ``config`` has ``max_positions`` (the Transformer's position table) decodes
at most that many steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from hyperplex.layers import shared_weights

__all__ = ["Hypothesis", "length_penalty", "reorder_state", "never_generated", "max_positions", "greedy_search",
           "beam_search", "decode", "replace_unk", "load_unk_dictionary"]


@dataclass
class Hypothesis:
    """One output sentence.

    Attributes:
        tokens: output ids without BOS and EOS.
        score: total log-probability (EOS included when generated); for beam search divided by
            :func:`length_penalty` of the generated length (EOS counted).
        attention: ``(len(tokens), S_len)`` weights over the true source positions, row ``i`` the
            step that produced ``tokens[i]``; ``None`` for models without attention.
    """

    tokens: list[int]
    score: float
    attention: Tensor | None = None


def length_penalty(length: int, alpha: float) -> float:
    """Wu et al. (2016) eq. 14: ``lp(Y) = ((5 + |Y|) / 6)^α`` (``α = 0``: no penalty)."""
    return ((5.0 + length) / 6.0) ** alpha


def reorder_state(state, index: Tensor):
    """Select rows ``index`` of every tensor in ``state`` (dicts, lists, tuples of tensors, ``None``)."""
    if isinstance(state, Tensor):
        return state.index_select(0, index.to(state.device))
    if isinstance(state, dict):
        return {key: reorder_state(value, index) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(reorder_state(value, index) for value in state)
    return state


def never_generated(model) -> list[int]:
    """Token ids search may not emit: the model's ``bos_index`` and ``pad_index`` (when it has one),
    never its ``eos_index``."""
    ids = {model.bos_index, getattr(model, "pad_index", None)}
    return sorted(i for i in ids if i is not None and i != model.eos_index)


def max_positions(model) -> int | None:
    """Longest sequence the model can encode or decode (``model.config.max_positions``), ``None`` if unlimited."""
    limit = getattr(getattr(model, "config", None), "max_positions", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def target_vocabulary_size(model) -> int | None:
    """Tokens the model can emit (``tgt_vocab_size``, else its target embedding's rows); ``None`` if unknown."""
    size = getattr(model, "tgt_vocab_size", None)
    if isinstance(size, int):
        return size
    embed = getattr(model, "tgt_embed", None)
    if isinstance(embed, torch.nn.Module):
        return next((m.num_embeddings for m in embed.modules() if isinstance(m, torch.nn.Embedding)), None)
    return None


def _masked(log_probs: Tensor, forbidden: Tensor) -> Tensor:
    """``log_probs (N, V)`` with the ``forbidden`` columns set to ``-inf`` (a copy)."""
    return log_probs.index_fill(-1, forbidden, float("-inf"))


def _check(model, src: Tensor, src_lengths: Tensor, max_output_length: int) -> tuple[int, Tensor]:
    """Validate the inputs; returns the step limit (capped at the model's positions) and the
    forbidden ids as a tensor on ``src``'s device."""
    if src.dim() != 2 or src_lengths.shape != (src.shape[0],):
        raise ValueError(f"search: expected src (B, S) and src_lengths (B,), got {tuple(src.shape)} and "
                         f"{tuple(src_lengths.shape)}")
    if not isinstance(max_output_length, int) or max_output_length < 1:
        raise ValueError(f"search: max_output_length must be a positive integer, got {max_output_length!r}")
    limit = max_positions(model)
    steps = max_output_length if limit is None else min(max_output_length, limit)
    return steps, torch.tensor(never_generated(model), dtype=torch.long, device=src.device)


def _attention_of(history: Tensor | None, count: int, source_length: int) -> Tensor | None:
    """The first ``count`` steps of one hypothesis's attention ``history (T, S)`` (on the CPU), cut to the
    true source length: ``(count, S_len)`` float32; ``None`` when attention is not kept."""
    if history is None:
        return None
    return history[:count, :source_length].float().clone()


@torch.no_grad()
def greedy_search(model, src: Tensor, src_lengths: Tensor, max_output_length: int = 100,
                  attention: bool = True) -> list[list[Hypothesis]]:
    """Pick the most probable token at every step.

    Shapes: ``src (B, S)``, ``src_lengths (B,)``. Returns one list with one :class:`Hypothesis`
    per sentence; its score is the unpenalised log-probability. A sentence without EOS after
    ``max_output_length`` steps is cut there. ``<s>``/``<pad>`` are never chosen (module doc).
    ``attention=False`` keeps no attention rows (``Hypothesis.attention`` is ``None``): what
    :func:`replace_unk` needs costs memory and time on every step.
    """
    max_output_length, forbidden = _check(model, src, src_lengths, max_output_length)
    B = src.shape[0]
    state = model.encode(src, src_lengths)
    prev = torch.full((B,), model.bos_index, dtype=torch.long, device=src.device)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    scores = torch.zeros(B, dtype=torch.float64, device=src.device)
    tokens, attentions = [], []
    for step in range(max_output_length):
        log_probs, state, step_attention = model.decode_step(prev, state, step)
        best, prev = _masked(log_probs, forbidden).max(dim=-1)  # (B,)
        scores += torch.where(finished, 0.0, best.double())
        tokens.append(prev)
        if attention and step_attention is not None:
            attentions.append(step_attention)
        finished |= prev == model.eos_index
        if bool(finished.all()):
            break
    token_rows = torch.stack(tokens, dim=1).tolist()  # (B, steps)
    score_rows, lengths = scores.tolist(), src_lengths.tolist()
    history = torch.stack(attentions, dim=1).cpu() if attentions else None  # (B, steps, S), one copy
    results = []
    for b in range(B):
        row = token_rows[b]
        out = row[:row.index(model.eos_index)] if model.eos_index in row else row
        rows = None if history is None else history[b]
        results.append([Hypothesis(out, score_rows[b], _attention_of(rows, len(out), lengths[b]))])
    return results


@torch.no_grad()
def beam_search(model, src: Tensor, src_lengths: Tensor, beam_size: int = 5, beam_alpha: float = 0.6,
                max_output_length: int = 100, n_best: int = 1, attention: bool = True) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``n_best`` hypotheses of each sentence, best first.

    The batch is decoded together: the encoder state is expanded to ``B · beam_size`` rows
    (``index_select(0, …)``) and reordered after every step to follow the surviving beams.
    Beams are ranked by total log-probability; a hypothesis that emits EOS among the top
    ``beam_size`` candidates of its sentence is finished and scored ``log P / lp(|Y|)``
    (:func:`length_penalty`, ``|Y|`` counting EOS; ``α = beam_alpha``); the ``beam_size`` best
    other candidates survive. A sentence stops once the best candidate of a step has ended in EOS
    (as JoeyNMT / OpenNMT) and it has ``n_best`` finished hypotheses — not after ``beam_size``
    finished ones (fairseq), which on peaked distributions can stop before the best beam ends.
    At ``max_output_length`` the surviving beams are scored as they are. ``<s>``/``<pad>`` are
    never extended (module doc). ``attention=False`` keeps no attention history (see
    :func:`greedy_search`). The hypotheses finished at a step reach the host together, so a GPU
    waits for the host a fixed few times a step, not once per hypothesis.
    """
    max_output_length, forbidden = _check(model, src, src_lengths, max_output_length)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_search: beam_size must be an integer >= 1, got {beam_size!r}")
    if not isinstance(n_best, int) or not 1 <= n_best <= beam_size:
        raise ValueError(f"beam_search: n_best must be in [1, beam_size={beam_size}], got {n_best!r}")
    vocabulary = target_vocabulary_size(model)
    if vocabulary is not None and beam_size > vocabulary:  # B·beam_size decoder rows for nothing: it would not end
        raise ValueError(f"beam size {beam_size:,} (--beam-size / testing.beam_size) is more than the {vocabulary:,} "
                         f"tokens of the model's target vocabulary; at most {vocabulary:,}")
    B, K, device = src.shape[0], beam_size, src.device
    state = model.encode(src, src_lengths)
    state = reorder_state(state, torch.arange(B, device=device).repeat_interleave(K))  # (B·K, ...)
    prev = torch.full((B * K,), model.bos_index, dtype=torch.long, device=device)
    beam_scores = torch.full((B, K), float("-inf"), dtype=torch.float64, device=device)
    beam_scores[:, 0] = 0.0  # all beams start identical: keep one
    history = torch.zeros(B * K, 0, dtype=torch.long, device=device)  # tokens so far, (B·K, t)
    attention_history: Tensor | None = None  # (B·K, t, S)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    top_finished = [False] * B  # the best candidate of some step was EOS
    lengths = src_lengths.tolist()
    row_offset = (torch.arange(B, device=device) * K)[:, None]  # (B, 1)
    for step in range(max_output_length):
        log_probs, state, step_attention = model.decode_step(prev, state, step)  # (B·K, V)
        log_probs = _masked(log_probs, forbidden)
        V = log_probs.shape[-1]
        candidates = (beam_scores[:, :, None] + log_probs.double().view(B, K, V)).view(B, K * V)
        top_scores, top_index = candidates.topk(min(2 * K, K * V), dim=1)  # (B, 2K): ≥ K are not EOS
        origin, token = top_index // V, top_index % V
        is_eos = token == model.eos_index
        # finish EOS candidates ranked among the top K of a sentence still running; the attention of the
        # EOS step itself is not kept (a hypothesis's rows are those of its tokens)
        eos_hits = (is_eos[:, :K] & torch.isfinite(top_scores[:, :K])).nonzero().tolist()
        for b, j in eos_hits:
            top_finished[b] |= j == 0
        hits = [(b, j) for b, j in eos_hits if not done[b]]
        if hits:
            hit_b, hit_j = torch.tensor(hits, device=device).unbind(1)
            rows = hit_b * K + origin[hit_b, hit_j]
            found = torch.cat([top_scores[hit_b, hit_j, None], history.index_select(0, rows).double()], 1).tolist()
            past = None if attention_history is None else attention_history.index_select(0, rows).cpu()
            penalty = length_penalty(step + 1, beam_alpha)
            for i, (b, _) in enumerate(hits):
                score, *tokens = found[i]
                rows_i = None if past is None else past[i]
                if rows_i is None and attention and step_attention is not None:  # step 0: no past rows
                    rows_i = torch.zeros(0, step_attention.shape[-1])
                finished[b].append(Hypothesis([int(t) for t in tokens], score / penalty,
                                              _attention_of(rows_i, len(tokens), lengths[b])))
        for b in range(B):
            done[b] = done[b] or (top_finished[b] and len(finished[b]) >= n_best)
        if all(done):
            break
        # survivors: the first K candidates that are not EOS (sort key puts EOS last, keeps rank)
        rank = torch.arange(top_scores.shape[1], device=device)[None]
        keep = (is_eos.long() * top_scores.shape[1] + rank).argsort(dim=1)[:, :K]  # (B, K)
        select = (row_offset + origin.gather(1, keep)).view(-1)  # rows of the previous beams, (B·K,)
        beam_scores = top_scores.gather(1, keep)
        beam_scores[torch.tensor(done, device=device)] = float("-inf")  # stopped sentences: no survivors
        prev = token.gather(1, keep).view(-1)
        state = reorder_state(state, select)
        history = torch.cat([history.index_select(0, select), prev[:, None]], dim=1)
        if attention and step_attention is not None:
            step_attention = step_attention.float().index_select(0, select)[:, None]
            attention_history = step_attention if attention_history is None else torch.cat(
                [attention_history.index_select(0, select), step_attention], dim=1)
    else:  # max_output_length reached: score the surviving beams as they are
        penalty = length_penalty(max_output_length, beam_alpha)
        survivors, tokens_of = beam_scores.tolist(), history.tolist()
        past = None if attention_history is None else attention_history.cpu()
        for b in range(B):
            if done[b]:
                continue
            for k in range(K):
                score = survivors[b][k]
                if score == float("-inf"):
                    continue
                row = b * K + k
                tokens = tokens_of[row]
                finished[b].append(Hypothesis(tokens, score / penalty, _attention_of(
                    None if past is None else past[row], len(tokens), lengths[b])))
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:n_best] for hyps in finished]


@torch.no_grad()
def decode(model, src: Tensor, src_lengths: Tensor, beam_size: int = 1, beam_alpha: float = 0.6,
           max_output_length: int = 100, n_best: int = 1, attention: bool = True,
           share_weights: bool | None = None) -> list[list[Hypothesis]]:
    """Greedy search for ``beam_size == 1`` (and ``n_best == 1``), beam search otherwise — which is where
    the arguments are checked. ``attention=False``: no attention rows kept (faster; no ``replace_unk``).

    ``share_weights``: whether each PHM layer's ``H`` is formed once for the whole search
    (:func:`hyperplex.layers.shared_weights` with ``always=True``) instead of each step taking the layer's
    per-call path. ``None`` (the default): on CUDA, where an eager decoding step is bound by its kernel launches
    and one ``F.linear`` a layer is the fewest (docs/performance.md, "On a GPU"), and not on the CPU, where a
    step reads the weights and the paths that read ``1/n`` of them are faster on large layers (on small ones, a
    d_model 512 model's, a call's fixed cost is most of its time, and the PHM model decodes slower than the dense one:
    docs/performance.md, "Transformer family"). The same results to rounding; on
    CUDA the formed ``H`` are held during the search (the dense model's weight memory)."""
    if share_weights is None:
        share_weights = _on_cuda(model)
    if not share_weights:
        return _search(model, src, src_lengths, beam_size, beam_alpha, max_output_length, n_best, attention)
    rows = src.shape[0] * max(beam_size, n_best) * max_output_length  # at most, over the search's steps
    with shared_weights(model, rows, always=True):
        return _search(model, src, src_lengths, beam_size, beam_alpha, max_output_length, n_best, attention)


def _search(model, src: Tensor, src_lengths: Tensor, beam_size: int, beam_alpha: float, max_output_length: int,
            n_best: int, attention: bool) -> list[list[Hypothesis]]:
    if beam_size == 1 and n_best == 1:
        return greedy_search(model, src, src_lengths, max_output_length, attention=attention)
    return beam_search(model, src, src_lengths, beam_size, beam_alpha, max_output_length, n_best,
                       attention=attention)


def _on_cuda(model) -> bool:
    """Whether ``model``'s first parameter is on a CUDA device (a model without parameters: no)."""
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter is not None and parameter.device.type == "cuda"


# ---------------------------------------------------------------------------- <unk> replacement
def replace_unk(output_tokens: list[str], source_tokens: list[str], attention: Tensor, unk_token: str = "<unk>",
                dictionary: dict[str, str] | None = None) -> list[str]:
    """Thesis §3.6 (Jean et al. 2015): replace each ``unk_token`` in ``output_tokens`` by the source
    token with the highest attention weight at that output step — or by its translation in
    ``dictionary`` when it has one.

    Shapes: ``attention (T, S)`` with ``T ≥ len(output_tokens)`` (row ``i`` produced output ``i``)
    and ``S ≥ len(source_tokens)`` (columns past the source are ignored). Ties go to the first
    position.
    """
    if attention is None:
        raise ValueError("replace_unk needs attention weights; a model without attention cannot replace <unk>")
    if attention.dim() != 2 or attention.shape[0] < len(output_tokens) or attention.shape[1] < len(source_tokens):
        raise ValueError(f"replace_unk: attention must be (T, S) with T >= {len(output_tokens)} output tokens and "
                         f"S >= {len(source_tokens)} source tokens, got {tuple(attention.shape)}")
    if not source_tokens:
        return list(output_tokens)
    best = attention[:, :len(source_tokens)].argmax(dim=1).tolist()
    out = []
    for i, token in enumerate(output_tokens):
        if token == unk_token:
            source = source_tokens[best[i]]
            token = dictionary.get(source, source) if dictionary else source
        out.append(token)
    return out


def load_unk_dictionary(path: str | os.PathLike) -> dict[str, str]:
    """Read a ``source<TAB>target`` (or ``source target``) dictionary, one pair per line.

    Blank lines and lines starting with ``#`` are skipped; with a tab the two fields may contain
    spaces. The first entry of a repeated source word wins. A malformed line raises
    ``ValueError`` naming the file and line.
    """
    dictionary: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.rstrip("\r\n")
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            fields = text.split("\t") if "\t" in text else text.split()
            fields = [f.strip() for f in fields]
            if len(fields) != 2 or not all(fields):
                raise ValueError(f"{path}:{number}: expected 'source<TAB>target' or 'source target' "
                                 f"(two non-empty fields), got {text!r}")
            dictionary.setdefault(fields[0], fields[1])
    return dictionary
