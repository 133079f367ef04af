"""A random forest as plain arrays: exported from scikit-learn, evaluated with numpy.

The shipped model is a few small trees. Keeping it as node arrays in an `.npz` (no pickle)
makes loading safe and instant — the localizer never imports scikit-learn — and evaluation
walks all trees for all rows at once, one vectorized step per tree level.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Mean P(abnormal) over trees, per row of x (float32 features).

        Rows that reach a leaf leave the working set, so each level only touches the rows
        still descending; features are read column-major through one flat index.
        """
        n = x.shape[0]
        t_count = self.feature.shape[0]
        if n == 0:
            return np.zeros(0)
        flat = np.ascontiguousarray(x.T, dtype=np.float32).ravel()  # free when x is a transposed view
        out = np.zeros(n, dtype=np.float64)
        for t in range(t_count):  # a handful of trees; each level is one vectorized step
            f_t, th_t, l_t, r_t = self.feature[t], self.threshold[t], self.left[t], self.right[t]
            leaf_of = np.zeros(n, dtype=np.int32)
            rows = np.arange(n)
            node = np.zeros(n, dtype=np.int32)
            for _ in range(self.depth + 1):
                f = f_t[node]
                inner = f >= 0
                if not inner.all():
                    leaf_of[rows[~inner]] = node[~inner]
                    rows, node, f = rows[inner], node[inner], f[inner]
                if rows.size == 0:
                    break
                v = flat[f.astype(np.int64) * n + rows]
                node = np.where(v <= th_t[node], l_t[node], r_t[node])
            out += self.proba[t][leaf_of]
        return out / t_count

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
