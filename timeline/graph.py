"""Graph computations on host and endpoint graphs, in NumPy and plain Python alone.

Connected components (which endpoints form one job), the edges that lie on a directed cycle
(which one-way edges close a ring), and the minimum-norm least-squares solution
of pairwise differences (clock offsets) were scipy's; scipy was the only reason to load it, and its
~18 MB of libraries counted against every verb's memory budget (issue #14)."""

from __future__ import annotations

import numpy as np

#: relative residual at which the conjugate gradients stop (the offsets are rounded to whole ns)
_TOLERANCE = 1e-13


def components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component label of each of the nodes 0..n-1 of the undirected graph with edges a[k]-b[k],
    numbered by each component's smallest node (scipy's connected_components numbering)."""
    label = np.arange(n, dtype=np.int64)
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    while True:  # each pass: every edge's ends take the smaller label, then labels follow their labels
        low = np.minimum(label[a], label[b])
        new = label.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        new = new[new]
        if np.array_equal(new, label):
            break
        label = new
    _, dense = np.unique(label, return_inverse=True)
    return dense.astype(np.int64)


def on_cycle(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per directed edge a[k]->b[k] of a graph on nodes 0..n-1: whether it lies on a directed cycle,
    i.e. both ends are in one strongly connected component (Tarjan's algorithm, iteratively: linear
    in nodes and edges, without recursion's depth limit on rings of thousands of nodes)."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    order = np.argsort(a, kind="stable")
    succ, first = b[order], np.searchsorted(a[order], np.arange(n + 1))
    index = np.full(n, -1, dtype=np.int64)
    low = np.zeros(n, dtype=np.int64)
    comp = np.full(n, -1, dtype=np.int64)
    on_stack = np.zeros(n, dtype=bool)
    stack: list[int] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, int(first[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            if i < first[v + 1]:
                work[-1] = (v, i + 1)
                w = int(succ[i])
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, int(first[w])))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = v
                    if w == v:
                        break
    return np.asarray(comp[a] == comp[b], dtype=bool)


def pairwise_least_squares(n: int, a: np.ndarray, b: np.ndarray, d: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x minimising sum_k (w[k] * (x[a[k]] - x[b[k]] - d[k]))**2, of least norm: each connected set of
    nodes centred on zero (differences cannot relate nodes that share no pair).

    Conjugate gradients on the normal equations (a weighted graph Laplacian, positive semidefinite):
    started at zero with a right-hand side orthogonal to its null space, the iterates stay in the
    Laplacian's range, which is the least-norm solution; each component is re-centred at the end
    against rounding drift."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    w2 = np.asarray(w, dtype=np.float64) ** 2
    d = np.asarray(d, dtype=np.float64)

    def laplacian(x: np.ndarray) -> np.ndarray:
        return _incidence_sum(n, a, b, w2 * (x[a] - x[b]))

    x = np.zeros(n)
    r = _incidence_sum(n, a, b, w2 * d)
    p = r.copy()
    rr = float(r @ r)
    stop = _TOLERANCE**2 * max(rr, np.finfo(float).tiny)
    for _ in range(10 * n + 10):
        if rr <= stop:
            break
        q = laplacian(p)
        pq = float(p @ q)
        if pq <= 0:
            break
        step = rr / pq
        x += step * p
        r -= step * q
        rr_next = float(r @ r)
        p = r + (rr_next / rr) * p
        rr = rr_next
    label = components(n, a, b)
    mean = np.bincount(label, x) / np.bincount(label)
    return x - mean[label]


def _incidence_sum(n: int, a: np.ndarray, b: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per node: the sum of f over the edges it starts minus over those it ends (float64)."""
    out: np.ndarray = np.bincount(a, f, minlength=n).astype(np.float64)
    out -= np.bincount(b, f, minlength=n)
    return out
