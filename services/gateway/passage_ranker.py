"""Which passages of a document bear on a question, best first: BM25 (the `bm25s` library) over
words and over Chinese character n-grams, with the passages that hold a clause the question
names by number (Section 9.4, Article 7, 第十八条, 第5.1.4条) ahead of the rest.

Pure functions: the route reads the first `k` of `rank(...)`."""

import logging
import re

import bm25s

logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index it builds: one per question

# Latin words and numbers ("9.4", "5.1.4" stay whole); runs of CJK ideographs
_WORD = re.compile(r"[0-9]+(?:\.[0-9]+)*|[^\W\d_]+", re.UNICODE)
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_LATIN_STOP = frozenset(
    "a an and are as at be by can do does for from has have how if in is it its may must of on or so that the their "
    "then there this to under was what when where which who whom why will with".split()
)
# a clause the question names: "Section 9.4", "clause 3", "Article 7", "§ 2.1"; 第十八条, 第5.1.4条
_NAMED_LATIN = re.compile(r"(?:section|article|clause|§)\s*([0-9]+(?:\.[0-9]+)*)", re.IGNORECASE)
_NAMED_CHINESE = re.compile(r"第\s*([0-9]+(?:\.[0-9]+)*|[一二三四五六七八九十百零〇两]+)\s*[条章款节]")


def terms(text: str) -> list[str]:
    """BM25 terms: lowercased Latin words (stop words dropped), numbers, and each CJK run's
    characters and character bigrams (Chinese has no spaces between words)."""
    found = []
    for run in re.split(_CJK_RUN, text.lower()):
        found += [w for w in _WORD.findall(run) if w not in _LATIN_STOP]
    for run in _CJK_RUN.findall(text):
        found += list(run) + [run[i : i + 2] for i in range(len(run) - 1)]
    return found


def named_clauses(question: str) -> list[str]:
    """How the clauses the question names open a line: "9.4", "article 7", "第十八条"."""
    named = []
    for match in _NAMED_LATIN.finditer(question):
        number = match.group(1)
        named += [number, f"article {number}", f"section {number}"]
    for match in _NAMED_CHINESE.finditer(question):
        numeral = match.group(1)
        named += [numeral] if numeral[0].isdigit() else [match.group(0).replace(" ", "")]
    return named


def holds_clause(passage_text: str, named: list[str]) -> bool:
    """Whether a line of the passage opens with a named clause ("9.4 Notices", not "9.41" or "9.4.1")."""
    for line in passage_text.lower().splitlines():
        line = line.lstrip()
        for opening in named:
            if line.startswith(opening):
                rest = line[len(opening) : len(opening) + 2]
                if not (rest[:1].isdigit() or (rest[:1] == "." and rest[1:2].isdigit())):
                    return True
    return False


def rank(question: str, passage_texts: list[str]) -> list[int]:
    """Indices of the passages (0-based, as given), most relevant first: those holding a clause the
    question names, then by BM25 score; ties keep document order."""
    if not passage_texts:
        return []
    scores = bm25_scores(question, passage_texts)
    named = named_clauses(question)
    anchored = [holds_clause(t, named) for t in passage_texts] if named else [False] * len(passage_texts)
    return sorted(range(len(passage_texts)), key=lambda i: (not anchored[i], -scores[i], i))


def bm25_scores(question: str, passage_texts: list[str]) -> list[float]:
    corpus = [terms(t) or [""] for t in passage_texts]  # bm25s needs a term in every passage
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    vocabulary = retriever.vocab_dict
    known = [t for t in terms(question) if t in vocabulary]
    if not known:
        return [0.0] * len(passage_texts)
    return [float(s) for s in retriever.get_scores(known)]
