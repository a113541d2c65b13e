"""`bench.document_questions`'s table row: time, ratio to the first question, passages read, the
prompt tokens cached and the tokens generated, as the gateway's answer reports them; and each
question's time by id against its time with every passage read."""

from bench.document_questions import row, side_by_side

ANSWER = {"passages_read": [{"index": n} for n in (7, 3, 12, 1)], "chunks": 62,
          "usage": {"prompt_tokens": 2400, "completion_tokens": 150, "prompt_tokens_details": {"cached_tokens": 1040}}}


def test_a_row_names_the_route_the_time_and_what_was_read():
    assert row("by id, ranked", 2, 30.0, ANSWER, first_s=60.0) == \
        "| by id, ranked | 2 | 30.0 | 0.50× | 4 of 62 (7, 3, 12, 1) | 2400 | 1040 | 150 |"


def test_the_numbers_of_many_passages_read_are_left_out():
    every = {**ANSWER, "passages_read": [{"index": n} for n in range(1, 63)]}
    assert "| 62 of 62 | 2400 |" in row("inline, every passage", 2, 90.0, every, first_s=60.0)


def test_the_first_question_has_no_ratio():
    assert "| 60.0 | — |" in row("by id, ranked", 1, 60.0, ANSWER, first_s=None)


def test_each_question_asked_both_ways_gets_its_ratio():
    assert side_by_side({1: 20.0, 2: 5.0}, {1: 40.0, 2: 50.0}) == "by id ÷ every passage: question 1 0.50; question 2 0.10"
