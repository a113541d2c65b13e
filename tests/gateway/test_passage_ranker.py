"""The passage ranker: its terms, the clauses a question names, and its retrieval recall on the
contract fixtures against the clause each labelled question is about (questions.json), with the
real chunker's passages at its default budget and SmolLM2's tokenizer."""

import json

import pytest

from common.tokenizer import load_tokenizer
from services.chunker.boundaries import ChunkParams
from services.chunker.chunker import Chunker
from services.gateway.documents import Passage, choose_passages
from services.gateway.passage_ranker import holds_clause, named_clauses, rank, terms
from services.gateway.settings import GatewaySettings
from tests.helpers.paths import CONTRACTS

QUESTIONS = {name: items for name, items in json.loads((CONTRACTS / "questions.json").read_text()).items()
             if not name.startswith("_")}


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
def recall():
    """Per language, how many labelled questions find their clause's passage among the k read."""
    tokenizer, k = load_tokenizer("smollm2-135m"), GatewaySettings().document_passages_read
    found = {"en": [0, 0], "zh": [0, 0]}
    for name, items in QUESTIONS.items():
        text = (CONTRACTS / name).read_text(encoding="utf-8")
        passages = Chunker(tokenizer).split(text, ChunkParams()).passages
        texts = [text[p.start_char : p.end_char] for p in passages]
        assert len(passages) > k  # the question reads only some of the document
        for item in items:
            at = [i for i in range(len(text)) if text.startswith(item["clause"], i) and (i == 0 or text[i - 1] == "\n")]
            assert len(at) == 1, f"{name}: the label {item['clause']!r} opens exactly one line"
            holding = {j for j, p in enumerate(passages) if p.start_char <= at[0] < p.end_char}
            counts = found[name[:2]]
            counts[0] += bool(holding & set(rank(item["question"], texts)[:k]))
            counts[1] += 1
    return found


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_clause_a_question_is_about_is_among_the_passages_read(recall, language):
    hits, questions = recall[language]
    assert questions >= 20 and hits / questions >= 0.95
