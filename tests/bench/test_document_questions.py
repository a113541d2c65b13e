"""`bench.document_questions`'s table row: time, ratio to the first question, passages read and
the prompt tokens cached, as the gateway's answer reports them."""

from bench.document_questions import row

ANSWER = {"passages_read": [{}] * 4, "chunks": 62,
          "usage": {"prompt_tokens": 2400, "prompt_tokens_details": {"cached_tokens": 1040}}}


def test_a_row_names_the_route_the_time_and_what_was_read():
    assert row("by id, ranked", 2, 30.0, ANSWER, first_s=60.0) == "| by id, ranked | 2 | 30.0 | 0.50× | 4 of 62 | 2400 | 1040 |"


def test_the_first_question_has_no_ratio():
    assert "| 60.0 | — |" in row("by id, ranked", 1, 60.0, ANSWER, first_s=None)
