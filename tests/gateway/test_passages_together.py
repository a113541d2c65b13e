"""A question's passages read together: the prompt, the choice between reading together and
taking notes against the context, and the citations of an answer that had no notes."""

import pytest

from services.gateway.documents import Passage
from services.gateway.errors import OpenAIError
from services.gateway.passages_together import how_to_read, together_citations, together_messages


def passage(index, anchor="Section 1"):
    return Passage(index, anchor, index * 100, index * 100 + 90, f"text of part {index}")


def test_the_prompt_holds_every_passage_marked_with_its_number_and_clause_then_the_question():
    [system, user] = together_messages("Who may terminate?", [passage(2, "Article 9"), passage(7, "")])
    text = user["content"]
    assert "[2] (Article 9)\ntext of part 2" in text and "[7] (part 7)\ntext of part 7" in text
    assert text.index("text of part 2") < text.index("text of part 7") < text.index("Question: Who may terminate?")
    assert system["role"] == "system" and "cite the [n]" in text


@pytest.mark.parametrize("asked, prompt, max_tokens, context, expected", [
    ("auto", 2000, 256, 8192, "together"),
    ("auto", 7936, 256, 8192, "together"),  # exactly the context
    ("auto", 7937, 256, 8192, "notes"),
    ("auto", 100_000, 256, None, "together"),  # no context known yet: the engine refuses what it cannot hold
    ("notes", 10, 10, 8192, "notes"),
    ("together", 7936, 256, 8192, "together"),
])
def test_how_a_question_s_passages_are_read(asked, prompt, max_tokens, context, expected):
    assert how_to_read(asked, prompt, max_tokens, context) == expected


@pytest.mark.parametrize("asked, prompt, context, expected", [
    ("auto", 1900, 8192, "notes"),  # fits, but the warm-up prefilled every passage's note prompt
    ("auto", 8000, 8192, "notes"),
    ("auto", 1900, None, "notes"),
    ("together", 1900, 8192, "together"),  # asked for: the warm-up does not overrule it
    ("notes", 1900, 8192, "notes"),
])
def test_a_document_warmed_at_upload_is_read_as_notes_unless_together_is_asked_for(asked, prompt, context, expected):
    assert how_to_read(asked, prompt, 256, context, warm=True) == expected


def test_a_warmed_document_asked_to_be_read_together_past_the_context_is_still_refused():
    with pytest.raises(OpenAIError):
        how_to_read("together", 8000, 256, 8192, warm=True)


def test_passages_asked_to_be_read_together_that_do_not_fit_are_refused_naming_the_context():
    with pytest.raises(OpenAIError) as refused:
        how_to_read("together", 8000, 256, 8192)
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "read")
    assert "8256" in error.message and "8192" in error.message and '"notes"' in error.message


def test_an_answer_read_together_cites_what_it_names_else_every_passage_it_was_given():
    given = [passage(2), passage(5), passage(9)]
    assert [c["index"] for c in together_citations("per [9] and [2], and [9] again; [4] was not given", given)] == [9, 2]
    assert [c["index"] for c in together_citations("no marks", given)] == [2, 5, 9]
    assert together_citations("x", given)[0] == {"index": 2, "anchor": "Section 1", "start_char": 200, "end_char": 290}
