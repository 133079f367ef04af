"""A random forest as plain arrays: exported from scikit-learn, evaluated with numpy.

The shipped model is a few small trees. Keeping it as node arrays in an `.npz` (no pickle)
makes loading safe and instant — the localizer never imports scikit-learn — and evaluation
walks all trees for a chunk of rows at once, one vectorized step per tree level.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

_PAD = 15  # feature column that is always 0: what leaves test


@dataclass
class ArrayForest:
    feature: np.ndarray  # [T, N] int32, -1 at leaves
    threshold: np.ndarray  # [T, N] float32
    left: np.ndarray  # [T, N] int32
    right: np.ndarray  # [T, N] int32
    proba: np.ndarray  # [T, N] float32: P(abnormal) at each node
    depth: int

    @classmethod
    def from_sklearn(cls, model: object) -> ArrayForest:
        trees = [est.tree_ for est in model.estimators_]  # type: ignore[attr-defined]
        n = max(t.node_count for t in trees)
        t_count = len(trees)
        feature = np.full((t_count, n), -1, dtype=np.int32)
        threshold = np.zeros((t_count, n), dtype=np.float32)
        left = np.zeros((t_count, n), dtype=np.int32)
        right = np.zeros((t_count, n), dtype=np.int32)
        proba = np.zeros((t_count, n), dtype=np.float32)
        for i, t in enumerate(trees):
            k = t.node_count
            leaf = t.children_left[:k] < 0
            feature[i, :k] = np.where(leaf, -1, t.feature[:k])
            threshold[i, :k] = t.threshold[:k]
            left[i, :k] = np.where(leaf, np.arange(k), t.children_left[:k])
            right[i, :k] = np.where(leaf, np.arange(k), t.children_right[:k])
            v = t.value[:k, 0, :]
            proba[i, :k] = v[:, -1] / np.maximum(v.sum(axis=1), 1e-12)
        depth = max(est.get_depth() for est in model.estimators_)  # type: ignore[attr-defined]
        return cls(feature, threshold, left, right, proba, int(depth))

    @cached_property
    def _flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """All trees as one node table for `predict_proba`: (records, P(abnormal), roots, and
        per tree its largest leaf P(abnormal)).

        Nodes are renumbered breadth-first so that a node's right child follows its left one;
        each record packs the float32 threshold's bits (high word) with left*16 + feature (low
        word), so one gather fetches a node. A leaf points to itself with threshold +inf on
        a padding feature, so rows that reached a leaf stay there for the remaining levels.
        """
        recs, probs, roots, top = [], [], [], []
        base = 0
        for t in range(self.feature.shape[0]):
            f_t, l_t, r_t = self.feature[t], self.left[t], self.right[t]
            order = [0]
            i = 0
            while i < len(order):  # breadth-first over a few hundred nodes, once per model
                k = order[i]
                i += 1
                if f_t[k] >= 0:
                    order += [int(l_t[k]), int(r_t[k])]
            nodes = np.asarray(order, dtype=np.int64)
            new_id = np.zeros(self.feature.shape[1], dtype=np.int64)
            new_id[nodes] = np.arange(len(nodes)) + base
            leaf = f_t[nodes] < 0
            left = np.where(leaf, new_id[nodes], new_id[l_t[nodes]])
            feat = np.where(leaf, _PAD, f_t[nodes]).astype(np.int64)
            thr = np.where(leaf, np.inf, self.threshold[t][nodes]).astype(np.float32)
            recs.append((thr.view(np.uint32).astype(np.int64) << 32) | (left * 16 + feat))
            probs.append(self.proba[t][nodes].astype(np.float64))
            top.append(float(self.proba[t][nodes][leaf].max()))
            roots.append(base)
            base += len(nodes)
        return np.concatenate(recs), np.concatenate(probs), np.asarray(roots, dtype=np.int64), np.asarray(top)

    def predict_proba(self, x: np.ndarray, settle: float | None = None) -> np.ndarray:
        """Mean P(abnormal) over trees, per row of x (float32 features, at most 15 columns).

        With `settle`, rows the first trees already place below it — even if every later
        tree gave its largest leaf — skip the later trees; their value is then only a lower
        bound (still below `settle`), which is all a decision at a threshold >= `settle` needs.
        """
        n = x.shape[0]
        if n == 0:
            return np.zeros(0)
        if x.shape[1] > _PAD:
            raise ValueError(f"at most {_PAD} features, got {x.shape[1]}")
        _, _, roots, top = self._flat
        t_count = len(roots)
        if settle is None:
            return self._tree_sum(x, 0, t_count) / t_count
        # the fewest leading trees after which some rows can be settled
        rest_max = np.r_[np.cumsum(top[::-1])[::-1], 0.0]  # rest_max[k]: most trees k.. can add
        k = next((i for i in range(1, t_count) if rest_max[i] < settle * t_count), t_count)
        total = self._tree_sum(x, 0, k)
        if k < t_count:
            open_rows = np.flatnonzero(total + rest_max[k] >= settle * t_count)
            total[open_rows] += self._tree_sum(x[open_rows], k, t_count)
        return total / t_count

    def _tree_sum(self, x: np.ndarray, first: int, last: int, chunk: int = 8192) -> np.ndarray:
        """Sum of P(abnormal) over trees first..last-1, per row.

        Level-synchronous: the trees descend one level per step for a chunk of rows at once
        (chunks small enough that the working set stays in cache), one gather for the nodes
        and one for the features they test.
        """
        n = x.shape[0]
        out = np.zeros(n)
        if n == 0 or last <= first:
            return out
        rec, prob, roots, _ = self._flat
        t_count = last - first
        c = min(chunk, n)
        rows = np.zeros((c, 16), dtype=np.float32)  # row-major, column _PAD stays 0
        flat = rows.ravel()
        row_base = np.tile(np.arange(c, dtype=np.int64) * 16, t_count)
        start_nodes = np.repeat(roots[first:last], c)
        for s in range(0, n, c):
            m = min(c, n - s)
            rows[:m, : x.shape[1]] = x[s:s + m]
            node = start_nodes
            for _ in range(self.depth):
                r = rec[node]
                low = r & 0xFFFFFFFF
                thr = (r >> 32).astype(np.uint32).view(np.float32)
                node = (low >> 4) + (flat[(low & 15) + row_base] > thr)
            out[s:s + m] = prob[node].reshape(t_count, c).sum(axis=0)[:m]
        return out

    def save(self, path: Path) -> None:
        """An .npz that np.load reads, written byte-for-byte reproducibly (fixed zip timestamps)."""
        arrays = {"feature": self.feature, "threshold": self.threshold, "left": self.left,
                  "right": self.right, "proba": self.proba, "depth": np.array([self.depth], dtype=np.int32)}
        tmp = path.with_name(path.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, arr in arrays.items():
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
                zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buf.getvalue(),
                            compress_type=zipfile.ZIP_DEFLATED)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ArrayForest:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["feature"], z["threshold"], z["left"], z["right"], z["proba"], int(z["depth"][0]))
