"""The chunker on the contract and filing fixtures, with SmolLM2's own tokenizer.

The clause reference here is the fixtures' layout: each clause or paragraph is one line
(services/chunker/clauses.py), which the anchor finder never looks at."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.chunker_baseline import fixed_windows
from common.tokenizer import load_tokenizer
from services.chunker.boundaries import MIN_PASSAGE_TOKENS, ChunkParams
from services.chunker.chunker import Chunker, tokenize
from services.chunker.clauses import clauses, count_split, is_split, unit_tokens
from tests.helpers.paths import CONTRACTS

FIXTURES = sorted((CONTRACTS).glob("*.txt"))
NAMES = [f.name for f in FIXTURES]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def documents(tokenizer):
    return {f.name: tokenize(tokenizer, f.read_text(encoding="utf-8")) for f in FIXTURES}


def test_the_fixtures_are_long_chinese_and_english_documents(documents):
    assert len(documents) >= 4
    chinese = [d for d in documents.values() if sum("\u4e00" <= ch <= "\u9fff" for ch in d.text) > 1000]
    english = [d for d in documents.values() if sum(ch.isascii() and ch.isalpha() for ch in d.text) > 5000]
    assert len(chinese) >= 2 and len(english) >= 2
    assert all(len(d.text) >= 2500 and len(clauses(d.text)) >= 30 for d in documents.values())


def test_clauses_are_the_non_empty_lines_with_their_line_breaks():
    text = "Title\n\n  1.1 First clause. \n(a) item\n"
    found = clauses(text)
    assert [text[c.start_char : c.end_char] for c in found] == ["Title", "1.1 First clause.", "(a) item"]
    assert [text[c.start_char : c.unit_end_char] for c in found] == ["Title\n\n  ", "1.1 First clause. \n", "(a) item\n"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    passage_tokens=st.integers(MIN_PASSAGE_TOKENS, 1200),
    overlap=st.floats(0, 0.5),
    threshold=st.floats(0, 1),
)
def test_no_clause_that_fits_is_split_and_every_passage_fits(tokenizer, documents, name, passage_tokens, overlap, threshold):
    doc = documents[name]
    passages = Chunker(tokenizer).split(doc.text, ChunkParams(passage_tokens, overlap, threshold)).passages
    starts = [start for start, _ in doc.offsets]

    assert passages[0].start_token == 0 and passages[-1].end_token == len(doc.offsets)
    assert passages[0].start_char == 0 and passages[-1].end_char == len(doc.text)
    for passage, following in zip(passages, passages[1:]):
        assert passage.start_token < following.start_token <= passage.end_token < following.end_token
    for passage in passages:
        assert 0 < passage.end_token - passage.start_token <= passage_tokens
        # character spans are where the token spans begin in the text
        assert passage.start_char == (0 if passage.start_token == 0 else starts[passage.start_token])
        assert passage.end_char == (len(doc.text) if passage.end_token == len(starts) else starts[passage.end_token])

    fitting = [c for c in clauses(doc.text) if unit_tokens(c, starts) <= passage_tokens]
    split = [doc.text[c.start_char : c.end_char][:40] for c in fitting if is_split(c, passages)]
    assert split == []


@pytest.mark.parametrize("passage_tokens", [64, 256, 1024])
def test_a_passage_tokenized_on_its_own_fits_its_budget(tokenizer, documents, passage_tokens):
    """The gateway tokenizes each passage's text again: cut at character boundaries, it still fits."""
    for doc in documents.values():
        for passage in Chunker(tokenizer).split(doc.text, ChunkParams(passage_tokens)).passages:
            text = doc.text[passage.start_char : passage.end_char]
            assert len(tokenizer.encode(text, add_special_tokens=False)) <= passage_tokens


def test_clause_token_counts_match_the_tokenizer_on_each_clause_alone(tokenizer, documents):
    """unit_tokens counts a clause within the document; tokenized alone it may differ only at its edges."""
    for doc in documents.values():
        starts = [start for start, _ in doc.offsets]
        for clause in clauses(doc.text)[:20]:
            alone = len(tokenizer.encode(doc.text[clause.start_char : clause.unit_end_char], add_special_tokens=False))
            assert abs(unit_tokens(clause, starts) - alone) <= 2


@pytest.mark.parametrize("passage_tokens", [128, 256, 512])
def test_fewer_clauses_are_split_than_by_fixed_windows(tokenizer, documents, passage_tokens):
    params = ChunkParams(passage_tokens)
    ours = fixed = total = 0
    for doc in documents.values():
        found = clauses(doc.text)
        ours += count_split(found, Chunker(tokenizer).split(doc.text, params).passages)
        fixed += count_split(found, fixed_windows(doc.offsets, len(doc.text), params))
        total += len(found)
    assert fixed / total > 0.04  # the measure can fail: fixed windows do split clauses
    assert ours < fixed / 2


def test_fixed_windows_are_passage_tokens_long_each_overlapping_the_last():
    offsets = [(i, i + 1) for i in range(100)]
    windows = fixed_windows(offsets, 100, ChunkParams(40, 0.25))
    assert [(w.start_token, w.end_token) for w in windows] == [(0, 40), (30, 70), (60, 100)]


def passage_opening_at(passages, text: str, opening: str):
    char = text.index(opening)
    return next(p for p in passages if p.start_char <= char < p.start_char + 3)


def test_passages_open_at_articles_and_carry_their_numbering(tokenizer, documents):
    doc = documents["zh_software_license.txt"]
    passages = Chunker(tokenizer).split(doc.text, ChunkParams(256, 0.0)).passages
    openings = [doc.text[p.start_char : p.start_char + 12].strip() for p in passages]
    numbered = [o for o in openings if o.startswith(("第", "（", "附件"))]
    assert len(numbered) >= len(passages) * 0.6, openings
    twelve = passage_opening_at(passages, doc.text, "第十二条 服务等级")
    assert twelve.anchor == "第四章 第十二条"

    doc = documents["en_master_services_agreement.txt"]
    passages = Chunker(tokenizer).split(doc.text, ChunkParams(256, 0.0)).passages
    anchors = {p.anchor for p in passages}
    assert any(a.startswith("ARTICLE 7 7.") for a in anchors), anchors


def test_the_threshold_changes_where_passages_end(tokenizer, documents):
    doc = documents["zh_data_security_rules.txt"]
    low = Chunker(tokenizer).split(doc.text, ChunkParams(512, 0.0, 0.0)).passages
    high = Chunker(tokenizer).split(doc.text, ChunkParams(512, 0.0, 1.0)).passages
    chapters = {m.start() for m in re.finditer(r"^第.{1,3}章", doc.text, re.MULTILINE)}
    assert sum(c.start_char in chapters for c in high) > sum(c.start_char in chapters for c in low)
    assert len(high) >= len(low)  # the price: passages end earlier


def test_a_document_without_line_breaks_is_cut_at_sentences(tokenizer):
    text = "。".join(f"第{i}项义务应当在约定期限内履行完毕并书面通知对方" for i in range(60)) + "。"
    passages = Chunker(tokenizer).split(text, ChunkParams(128, 0.0)).passages
    assert len(passages) > 3
    assert all(text[p.end_char - 1] == "。" for p in passages)
