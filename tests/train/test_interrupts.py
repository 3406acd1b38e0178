"""SIGINT/SIGTERM votes under DDP: every process stops at the step whose all-reduce carried the first signal, and
a signal that arrives after a process voted waits for the next step's vote (the CLI's single-process behaviour
is in tests/cli/test_cli_robustness_training.py; two real processes in tests/train/test_trainer.py)."""

import signal

from hyperplex.train.interrupts import InterruptFlag


def summed(*flags: InterruptFlag) -> list[float]:
    """What the step's all-reduce gives every process: the processes' votes summed entry by entry."""
    return [sum(column) for column in zip(*(flag.votes() for flag in flags))]


def test_no_signal_anywhere_stops_nothing():
    a, b = InterruptFlag(), InterruptFlag()
    counts = summed(a, b)
    assert counts == [0.0, 0.0]
    for flag in (a, b):
        flag.agree(counts)
        assert not flag.pending(world=2) and not flag.pending(world=1)


def test_a_signal_on_one_process_stops_every_process_named_by_it():
    got, other = InterruptFlag(), InterruptFlag()
    got._handle(signal.SIGTERM, None)
    counts = summed(got, other)
    assert counts == [0.0, 1.0]  # one entry per handled signal: SIGINT, SIGTERM
    for flag in (got, other):
        flag.agree(counts)
        assert flag.pending(world=2) and flag.signal_number == signal.SIGTERM


def test_each_process_names_its_own_signal_and_the_others_the_most_common():
    ctrl_c, term_a, term_b, none = InterruptFlag(), InterruptFlag(), InterruptFlag(), InterruptFlag()
    ctrl_c._handle(signal.SIGINT, None)
    term_a._handle(signal.SIGTERM, None)
    term_b._handle(signal.SIGTERM, None)
    counts = summed(ctrl_c, term_a, term_b, none)
    assert counts == [1.0, 2.0]
    for flag in (ctrl_c, term_a, term_b, none):
        flag.agree(counts)
    assert ctrl_c.agreed == signal.SIGINT and term_a.agreed == term_b.agreed == signal.SIGTERM
    assert none.agreed == signal.SIGTERM and none.signal_number == signal.SIGTERM
    assert all(flag.pending(world=4) for flag in (ctrl_c, term_a, term_b, none))


def test_a_signal_after_the_vote_waits_for_the_next_step_under_ddp():
    late, other = InterruptFlag(), InterruptFlag()
    counts = summed(late, other)
    late._handle(signal.SIGINT, None)  # between this step's all-reduce and the check at its end
    for flag in (late, other):
        flag.agree(counts)
    # stopping now would leave the other process waiting in the next step's collective
    assert not late.pending(world=2) and not other.pending(world=2)
    assert late.pending(world=1)  # one process: nothing to agree with, it stops at this step
    counts = summed(late, other)
    assert counts == [1.0, 0.0]
    for flag in (late, other):
        flag.agree(counts)
        assert flag.pending(world=2) and flag.signal_number == signal.SIGINT
