"""timeline.graph: components and least-norm pairwise least squares, against dense linear algebra."""

from __future__ import annotations

import numpy as np
import pytest

from timeline.graph import components, on_cycle, pairwise_least_squares


def test_components_are_numbered_by_their_smallest_node() -> None:
    # 0-4-2 | 1-3 | 5 alone | 6-7 (edges given in both directions and with repeats)
    a = np.array([4, 2, 3, 7, 4])
    b = np.array([0, 4, 1, 6, 2])
    assert components(8, a, b).tolist() == [0, 1, 0, 1, 0, 2, 3, 3]


def test_components_of_a_long_chain_given_backwards() -> None:
    n = 500
    a, b = np.arange(n - 1, 0, -1), np.arange(n - 2, -1, -1)
    assert (components(n, a, b) == 0).all()


def test_no_edges_every_node_its_own_component() -> None:
    assert components(3, np.zeros(0, int), np.zeros(0, int)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("seed", range(20))
def test_least_squares_is_the_dense_least_norm_solution(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    m = int(rng.integers(1, 3 * n))
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    a, b = a[a != b], b[a != b]
    truth = rng.normal(0, 5e7, n)
    d = truth[a] - truth[b] + rng.normal(0, 1e5, len(a))
    w = np.sqrt(rng.integers(1, 40, len(a)).astype(float))
    dense = np.zeros((len(a), n))
    dense[np.arange(len(a)), a] = w
    dense[np.arange(len(a)), b] = -w
    want = np.linalg.lstsq(dense, d * w, rcond=None)[0]  # (SVD: the least-norm solution)
    got = pairwise_least_squares(n, a, b, d, w)
    assert np.abs(got - want).max() < 1e-3  # (ns: the offsets are rounded to whole ns)


def test_consistent_differences_are_recovered_and_each_component_centred() -> None:
    x = np.array([10.0, 30.0, 20.0, 5.0, -5.0, 7.0])  # components {0, 1, 2}, {3, 4}, {5}
    a, b = np.array([0, 1, 3]), np.array([1, 2, 4])
    got = pairwise_least_squares(6, a, b, x[a] - x[b], np.ones(3))
    assert got == pytest.approx([-10.0, 10.0, 0.0, 5.0, -5.0, 0.0])


def test_on_cycle_marks_ring_edges_and_not_the_edges_between_rings() -> None:
    # two rings 0->1->2->0 and 3->4->3, joined one way by 2->3; a self-contained path 5->6
    a = np.array([0, 1, 2, 3, 4, 2, 5])
    b = np.array([1, 2, 0, 4, 3, 3, 6])
    assert on_cycle(7, a, b).tolist() == [True, True, True, True, True, False, False]


def test_on_cycle_follows_a_ring_of_thousands_of_nodes() -> None:
    n = 5000
    a = np.arange(n)
    b = (a + 1) % n
    assert on_cycle(n, a, b).all()
    assert not on_cycle(n, a[:-1], b[:-1]).any()  # the ring cut open is a path
