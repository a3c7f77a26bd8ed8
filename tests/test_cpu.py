"""training/cpu.py's thread choice, a pure function of the request, torch's default, the cores and
the load (no timings)."""

import pytest

from training.cpu import choose_threads


@pytest.mark.parametrize(
    "requested,default,cores,load,want",
    [
        (0, 2, 2, 0.0, 2),  # a quiet machine: torch's default
        (0, 2, 2, 1.0, 1),  # beside one busy process: the one free core
        (0, 2, 2, 5.7, 1),  # overloaded: still one thread
        (0, 16, 16, 3.4, 13),  # 16 cores, ~3 busy: the 13 left
        (0, 4, 16, 0.0, 4),  # never above torch's default
        (0, 8, 8, 0.4, 8),  # a light load rounds away
        (2, 2, 2, 1.0, 2),  # train.threads forces the count, whatever the load
        (6, 2, 2, 0.0, 6),
    ],
)
def test_threads_are_the_free_cores_unless_forced(requested, default, cores, load, want):
    assert choose_threads(requested, default, cores, load) == want
