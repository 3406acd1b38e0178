"""Encoder scoring, in one place: how good a compressed sentence encoder is next to its teacher.

* :mod:`.quality` — pure functions over an ``embed(list[str]) -> (N, D)`` callable: teacher agreement,
  zero-shot WikiQA ranking, the SST-2 probe, encoder sizes;
* :mod:`.encoders` — ``hyperplex score-encoder``: model folders scored next to their teacher
  (:func:`score_encoders`);
* :mod:`.plan_metrics` — the same metrics as an experiment plan's ``quality:`` key.
"""

from hyperplex.scoring.encoders import DEFAULT_FILES, METRICS, PROBE_C, find_student, resolve_teacher, score_encoders

__all__ = ["DEFAULT_FILES", "METRICS", "PROBE_C", "find_student", "resolve_teacher", "score_encoders"]
