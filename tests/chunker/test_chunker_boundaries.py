"""The boundary choice as a pure function. Offsets here give one token per character, so
token and character positions are the same number and every expected cut can be read off
the text by hand."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.anchors import ARTICLE, CLAUSE, HEADING, LINE, PHRASE, SENTENCE, Anchor
from services.chunker.boundaries import MAX_PASSAGE_TOKENS, MIN_PASSAGE_TOKENS, ChunkParams, choose_passages


def per_char(text: str) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(len(text))]


def passages_of(length: int, anchors: list[Anchor], passage_tokens: int, overlap: float = 0.0, threshold: float = 0.5):
    offsets = [(i, i + 1) for i in range(length)]
    params = ChunkParams(passage_tokens, overlap, threshold)
    return [(p.start_token, p.end_token) for p in choose_passages(anchors, offsets, length, params)]


def test_without_anchors_cuts_every_passage_tokens_with_the_overlap():
    assert passages_of(100, [], 40) == [(0, 40), (40, 80), (80, 100)]
    # overlap 0.25 × 40 = 10 tokens; with no anchor in the overlap it starts exactly 10 back
    assert passages_of(100, [], 40, overlap=0.25) == [(0, 40), (30, 70), (60, 100)]


def test_a_text_that_fits_is_one_passage_and_an_empty_one_none():
    assert passages_of(30, [Anchor(10, ARTICLE, "marker")], 40) == [(0, 30)]
    assert choose_passages([], [], 0, ChunkParams(32)) == []


def test_ends_at_the_last_line_start_in_reach_not_inside_a_line():
    # lines start at 0, 18, 36, 54, 72; sentence ends inside them at 9, 27, 45, 63
    lines = [Anchor(i, LINE, "line") for i in (18, 36, 54, 72)]
    sentences = [Anchor(i, SENTENCE, "sentence") for i in (9, 27, 45, 63)]
    assert passages_of(90, lines + sentences, 40) == [(0, 36), (36, 72), (72, 90)]


def test_the_threshold_lets_an_early_article_end_the_passage():
    # an article opens at 12 (early half of the 40-token window), clauses at 25 and 34
    anchors = [Anchor(12, ARTICLE, "marker"), Anchor(25, CLAUSE, "marker"), Anchor(34, CLAUSE, "marker")]
    assert passages_of(60, anchors, 40, threshold=0.8)[0] == (0, 12)  # only the article may end a passage by choice
    assert passages_of(60, anchors, 40, threshold=0.5)[0] == (0, 34)  # clauses may too: the fuller passage wins


def test_below_the_threshold_a_passage_still_ends_at_the_best_anchor_in_reach():
    anchors = [Anchor(12, LINE, "line"), Anchor(30, CLAUSE, "marker"), Anchor(35, LINE, "line")]
    # nothing reaches 0.9; in the later half (>= 20) the clause is the strongest
    assert passages_of(60, anchors, 40, threshold=0.9)[0] == (0, 30)


def test_a_stronger_anchor_in_the_later_half_beats_a_later_weaker_one():
    anchors = [Anchor(22, HEADING, "marker"), Anchor(30, LINE, "line"), Anchor(38, LINE, "line")]
    assert passages_of(60, anchors, 40, threshold=0.0)[0] == (0, 22)


def test_a_line_longer_than_the_passage_is_cut_at_its_last_sentence_end_in_reach():
    anchors = [Anchor(100, LINE, "line")] + [Anchor(i, SENTENCE, "sentence") for i in (15, 33, 52, 70)] + [Anchor(38, PHRASE, "phrase")]
    assert passages_of(120, anchors, 40) == [(0, 33), (33, 70), (70, 100), (100, 120)]


def test_overlap_starts_at_the_earliest_line_start_within_it():
    # overlap 0.5 × 40 = 20: after ending at 36 the next passage may start from 16
    anchors = [Anchor(i, LINE, "line") for i in (12, 20, 28, 36, 44, 52)] + [Anchor(17, SENTENCE, "sentence")]
    passages = passages_of(70, anchors, 40, overlap=0.5)
    assert passages[:2] == [(0, 36), (20, 52)]


def test_overlap_gives_way_so_that_the_following_line_fits():
    # the line after the first cut (36..70) is 34 tokens: a passage of 40 holding it can start no earlier than 30
    anchors = [Anchor(i, LINE, "line") for i in (10, 20, 28, 32, 36, 70)]
    passages = passages_of(80, anchors, 40, overlap=0.5)
    assert passages[0] == (0, 36)
    assert passages[1] == (32, 70)  # 28 would be the earliest within the overlap, but then 36..70 would not fit


def test_a_passage_never_starts_at_or_before_the_previous_start():
    # every line is 5 tokens and each passage barely advances; the starts must still move forward
    anchors = [Anchor(i, LINE, "line") for i in range(5, 200, 5)]
    passages = passages_of(200, anchors, 16, overlap=0.5)
    starts = [s for s, _ in passages]
    assert starts == sorted(set(starts))


def test_cuts_only_at_character_boundaries_when_a_character_spans_several_tokens():
    # tokens 0-1 share character 0, tokens 2-4 share character 1, ...: 3 tokens per character from 2 on
    offsets = [(0, 1), (0, 1)] + [(1 + i // 3, 2 + i // 3) for i in range(60)]
    length = offsets[-1][1]
    passages = choose_passages([], offsets, length, ChunkParams(16, 0.0))
    assert all(p.end_token == len(offsets) or offsets[p.end_token - 1][1] <= offsets[p.end_token][0] for p in passages)
    assert [(p.start_char, p.end_char) for p in passages] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, length)]


def test_straddling_tokens_without_any_clean_boundary_are_still_cut_and_chars_stay_in_order():
    # every token ends one character past the next one's start: no boundary is clean
    offsets = [(i, i + 2) for i in range(50)]
    passages = choose_passages([], offsets, 51, ChunkParams(16, 0.0))
    assert [(p.start_token, p.end_token) for p in passages] == [(0, 16), (16, 32), (32, 48), (48, 50)]
    assert [(p.start_char, p.end_char) for p in passages] == [(0, 16), (16, 32), (32, 48), (48, 51)]


def test_an_anchor_inside_a_token_moves_to_that_token_start():
    # one token per character, except " Section" (chars 9-16, token 9); the anchor at "S" (10) cuts before the space
    text = "Preamble. Section 2 applies here and there."
    offsets = per_char(text[:9]) + [(9, 17)] + [(i, i + 1) for i in range(17, len(text))]
    anchor = Anchor(10, ARTICLE, "marker", "Section 2", "Section 2")
    first, second, *_ = choose_passages([anchor], offsets, len(text), ChunkParams(16, 0.0))
    assert (first.end_token, first.end_char) == (9, 9)
    assert (second.start_token, second.start_char, second.anchor) == (9, 9, "Section 2")


def test_each_passage_reports_the_path_in_force_where_it_opens():
    text = "x" * 90
    anchors = [
        Anchor(0, HEADING, "marker", "第一章", "第一章"),
        Anchor(30, ARTICLE, "marker", "第一条", "第一章 第一条"),
        Anchor(45, SENTENCE, "sentence", "", "第一章 第一条"),
        Anchor(60, ARTICLE, "marker", "第二条", "第一章 第二条"),
    ]
    passages = choose_passages(anchors, per_char(text), len(text), ChunkParams(32, 0.0))
    assert [(p.start_token, p.anchor) for p in passages] == [(0, "第一章"), (30, "第一章 第一条"), (60, "第一章 第二条")]


def test_no_anchor_before_the_start_means_an_empty_path():
    [passage] = choose_passages([], per_char("abc"), 3, ChunkParams(16))
    assert passage.anchor == ""


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"passage_tokens": MIN_PASSAGE_TOKENS - 1}, r"passage_tokens \(chunk_size\) must be between"),
        ({"passage_tokens": MAX_PASSAGE_TOKENS + 1}, r"passage_tokens \(chunk_size\) must be between"),
        ({"passage_tokens": 0}, r"passage_tokens \(chunk_size\) must be between"),
        ({"passage_tokens": 64.0}, r"passage_tokens \(chunk_size\) must be an integer"),
        ({"passage_tokens": True}, r"passage_tokens \(chunk_size\) must be an integer"),
        ({"overlap_ratio": -0.01}, "overlap_ratio must be between 0 and 0.5"),
        ({"overlap_ratio": 0.51}, "overlap_ratio must be between 0 and 0.5"),
        ({"overlap_ratio": math.nan}, "overlap_ratio"),
        ({"semantic_threshold": -0.1}, "semantic_threshold must be between 0 and 1"),
        ({"semantic_threshold": 1.01}, "semantic_threshold must be between 0 and 1"),
        ({"semantic_threshold": math.inf}, "semantic_threshold"),
    ],
)
def test_bad_params_are_refused_with_the_field_named(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        ChunkParams(**kwargs)


# --- properties over random documents --------------------------------------------------------------------------


@st.composite
def documents(draw):
    """Line lengths, and anchors of random strength: every line start, plus some inside lines."""
    line_lengths = draw(st.lists(st.integers(1, 120), min_size=1, max_size=40))
    line_starts = [0]
    for n in line_lengths[:-1]:
        line_starts.append(line_starts[-1] + n)
    length = line_starts[-1] + line_lengths[-1]
    strengths = st.sampled_from([LINE, 0.4, 0.5, CLAUSE, 0.75, ARTICLE, 0.9, HEADING])
    anchors = {s: Anchor(s, draw(strengths), "line") for s in line_starts}
    for inner in draw(st.lists(st.integers(1, max(1, length - 1)), max_size=30)):
        anchors.setdefault(inner, Anchor(inner, draw(st.sampled_from([PHRASE, SENTENCE, 0.25])), "sentence"))
    return length, line_starts, [anchors[k] for k in sorted(anchors)]


@settings(max_examples=300, deadline=None)
@given(
    documents(), st.integers(MIN_PASSAGE_TOKENS, 200), st.floats(0, 0.5), st.floats(0, 1),
)
def test_passages_cover_the_text_fit_the_budget_and_never_split_a_line_that_fits(document, passage_tokens, overlap, threshold):
    length, line_starts, anchors = document
    params = ChunkParams(passage_tokens, overlap, threshold)
    passages = passages_of(length, anchors, passage_tokens, overlap, threshold)

    assert passages[0][0] == 0 and passages[-1][1] == length
    for (start, end), (next_start, next_end) in zip(passages, passages[1:]):
        assert start < next_start <= end < next_end  # progress, no gap
        assert end - next_start <= params.overlap_tokens
    assert all(0 < end - start <= passage_tokens for start, end in passages)

    line_ends = line_starts[1:] + [length]
    for line_start, line_end in zip(line_starts, line_ends):
        if line_end - line_start <= passage_tokens:
            assert any(s <= line_start and line_end <= e for s, e in passages), (line_start, line_end, passages)
