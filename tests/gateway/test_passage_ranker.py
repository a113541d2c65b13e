"""The passage ranker: its terms, the clauses a question names, and its retrieval recall on the
contract fixtures against the clause each labelled question is about (questions.json), with the
real chunker's passages at its default budget and SmolLM2's tokenizer."""

import pytest

from bench.passage_recall import ranks
from common.tokenizer import load_tokenizer
from services.chunker.boundaries import ChunkParams
from services.gateway.documents import Passage, choose_passages
from services.gateway.passage_ranker import holds_clause, named_clauses, rank, terms
from services.gateway.settings import GatewaySettings


def test_latin_terms_are_lowercased_words_and_whole_clause_numbers_without_stop_words():
    assert terms("What does Section 9.4 say about the Notices?") == ["section", "9.4", "say", "about", "notices"]


def test_chinese_terms_are_characters_and_character_bigrams():
    assert terms("转让价款") == ["转", "让", "价", "款", "转让", "让价", "价款"]
    assert terms("第5.1.4条") == ["5.1.4", "第", "条"]


@pytest.mark.parametrize("question, named", [
    ("What does Section 9.4 say?", ["9.4", "article 9.4", "section 9.4"]),
    ("see clause 3 and § 2.1", ["3", "article 3", "section 3", "2.1", "article 2.1", "section 2.1"]),
    ("第十八条关于自动化决策有什么规定？", ["第十八条"]),
    ("第5.1.4条关于诉讼的保证是什么？", ["5.1.4"]),
    ("Who may terminate?", []),
])
def test_the_clauses_a_question_names(question, named):
    assert named_clauses(question) == named


def test_a_passage_holds_a_clause_only_where_a_line_opens_with_its_number():
    passage = "text\n  9.4 Notices. In writing.\n9.41 Other.\nARTICLE 7 INDEMNIFICATION"
    assert holds_clause(passage, ["9.4"]) and holds_clause(passage, ["article 7"])
    assert not holds_clause("9.41 Other.\n9.4.1 Sub.\nas in 9.4 above", ["9.4"])
    assert holds_clause("第十八条 本行利用个人信息", ["第十八条"]) and not holds_clause("依照第十八条", ["第十八条"])


def test_passages_holding_a_named_clause_come_first_then_by_bm25_ties_in_document_order():
    texts = ["fees are paid monthly", "9.4 Notices. Notices must be in writing.", "nothing here", "nothing there"]
    assert rank("What does Section 9.4 say about fees?", texts)[:2] == [1, 0]
    assert rank("fees", texts) == [0, 1, 2, 3]
    assert rank("unrelated words", texts) == [0, 1, 2, 3] and rank("q", []) == []


def test_choose_passages_keeps_the_best_count_best_first():
    passages = [Passage(i + 1, "", 0, 1, t) for i, t in enumerate(["a b", "fees due", "c d", "late fees due"])]
    assert [p.index for p in choose_passages("when are late fees due?", passages, 2)] == [4, 2]


@pytest.fixture(scope="module")
def best_ranks():
    return ranks(load_tokenizer("smollm2-135m"), ChunkParams().passage_tokens)


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_clause_a_question_is_about_is_among_the_passages_read(best_ranks, language):
    k, found = GatewaySettings().document_passages_read, best_ranks[language]
    assert len(found) >= 20 and all(passages > k for _, passages in found)  # a question reads only some passages
    assert sum(rank_ < k for rank_, _ in found) / len(found) >= 0.95
