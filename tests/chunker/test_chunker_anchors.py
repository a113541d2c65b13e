"""Anchor finding on small hand-written texts: what is found, how strong, labelled and nested."""

import pytest

from common.anchors import (
    ARTICLE,
    CLAUSE,
    ENUMERATION,
    HEADING,
    LINE,
    PARAGRAPH,
    PHRASE,
    PROVISO,
    REFERENCE,
    SECTION,
    SENTENCE,
    SUBCLAUSE,
    TITLE,
    find_anchors,
)


def at(text: str, opening: str):
    """The anchor found where `opening` first occurs in the text."""
    char = text.index(opening)
    found = [a for a in find_anchors(text) if a.char == char]
    assert found, f"no anchor at {opening!r}"
    return found[0]


@pytest.mark.parametrize(
    "line, strength, label",
    [
        ("第三章 保密义务", HEADING, "第三章"),
        ("第二编 合同", HEADING, "第二编"),
        ("附件一：授权节点清单", HEADING, "附件一"),
        ("第二节 数据分类", SECTION, "第二节"),
        ("第十二条 服务等级", ARTICLE, "第十二条"),
        ("第105条 附则", ARTICLE, "第105条"),
        ("三、最小必要原则。", ENUMERATION, "三、"),
        ("（二）乙方应当按期付款；", CLAUSE, "（二）"),
        ("(四)乙方应当按期付款；", CLAUSE, "(四)"),
        ("（3）修改公司章程；", SUBCLAUSE, "（3）"),
        ("2、签署本协议。", SUBCLAUSE, "2、"),
        ("3.2 受让方应当分期支付。", CLAUSE, "3.2"),
        ("3.2.1 第一期款项。", SUBCLAUSE, "3.2.1"),
        ("PART II", HEADING, "PART II"),
        ("Schedule A Fees", HEADING, "Schedule A"),
        ("ARTICLE 7 INDEMNIFICATION", ARTICLE, "ARTICLE 7"),
        ("Section 4 Security.", ARTICLE, "Section 4"),
        ("Section 4.2 Security Program.", CLAUSE, "Section 4.2"),
        ("Clause 9.1 Notices.", CLAUSE, "Clause 9.1"),
        ("Item 1A. Risk Factors", ARTICLE, "Item 1A."),
        ("12. Governing Law.", ARTICLE, "12."),
        ("4.3 Security Incidents.", CLAUSE, "4.3"),
        ("(b) reverse engineer the Platform;", SUBCLAUSE, "(b)"),
        ("(iv) is independently developed.", SUBCLAUSE, "(iv)"),
        ("# Data Security Rules", HEADING, "Data Security Rules"),
        ("## Scope", SECTION, "Scope"),
    ],
)
def test_numbered_markers_at_line_starts(line, strength, label):
    text = f"Preamble.\n{line}\nMore text."
    anchor = at(text, line)
    assert (anchor.strength, anchor.kind, anchor.label) == (strength, "marker", label)


@pytest.mark.parametrize(
    "line, kind, strength, label",
    [
        ("“保密信息”是指一方获知的商业秘密；", "definition", SUBCLAUSE, "“保密信息”"),
        ('"Affiliate" means any controlled entity.', "definition", SUBCLAUSE, '"Affiliate"'),
        ("RISKS RELATED TO OUR COMMON STOCK", "title", TITLE, "RISKS RELATED TO OUR COMMON STOCK"),
        ("软件许可及技术服务协议", "title", TITLE, "软件许可及技术服务协议"),
        ("The Parties agree as follows.", "line", LINE, ""),
    ],
)
def test_unnumbered_line_starts(line, kind, strength, label):
    anchor = at(f"Preamble.\n{line}\nMore text.", line)
    assert (anchor.kind, anchor.strength, anchor.label) == (kind, strength, label)


def test_a_line_after_a_blank_line_is_a_paragraph():
    text = "First paragraph.\n\n  Second paragraph.\nThird line."
    assert (at(text, "Second").kind, at(text, "Second").strength) == ("paragraph", PARAGRAPH)
    assert at(text, "Second").char == text.index("Second")  # indentation is not part of it
    assert at(text, "Third").strength == LINE


def test_a_hard_wrapped_line_continues_its_paragraph():
    text = "The Recipient shall protect the information using\nreasonable care. It shall not\ndisclose it.\nthe end is a new line."
    chars = {a.char for a in find_anchors(text) if a.strength >= LINE}
    assert text.index("reasonable") not in chars
    assert text.index("disclose") not in chars
    assert text.index("the end") in chars  # the line before ends a sentence


def test_sentence_ends_provisos_references_and_commas_inside_a_line():
    text = "第一条 乙方应当付款。除非另有规定，期限按自然日计算。本协议约定的期限，不含节假日。\nFees are due. Notwithstanding the foregoing, fees may be waived, subject to Section 3."
    assert (at(text, "除非").kind, at(text, "除非").strength) == ("proviso", PROVISO)
    assert at(text, "期限按").strength == PHRASE
    # "本协议约定" opens a sentence here, so it is a proviso, not a mere reference
    assert at(text, "本协议约定").strength == PROVISO
    assert at(text, "不含").strength == PHRASE
    assert (at(text, "Notwithstanding").kind, at(text, "Notwithstanding").strength) == ("proviso", PROVISO)
    assert (at(text, "subject to").kind, at(text, "subject to").strength) == ("reference", REFERENCE)
    plain = "It ends. The next one starts."
    assert (at(plain, "The next").kind, at(plain, "The next").strength) == ("sentence", SENTENCE)


def test_no_sentence_end_inside_numbers_or_before_lower_case():
    text = "See Section 2.1 of the Agreement. and then 3.5 million shares"
    inside = {a.char for a in find_anchors(text) if a.kind in ("sentence", "proviso")}
    assert inside == set()


def test_one_anchor_per_position_the_strongest():
    text = "前言。\n第一条 总则。除非另有规定，适用本办法。"
    anchors = find_anchors(text)
    assert len({a.char for a in anchors}) == len(anchors)
    assert at(text, "第一条").strength == ARTICLE


def test_paths_nest_markers_and_a_marker_replaces_its_equals_and_lowers():
    text = "\n".join([
        "软件许可协议", "第一章 总则", "第一条 定义。", "（一）许可软件；", "（二）用户；", "正文继续。",
        "第二条 许可。", "第二章 费用", "第三条 付款。",
    ])
    assert at(text, "软件许可协议").path == "软件许可协议"
    assert at(text, "第一章").path == "第一章"  # a chapter outranks the title
    assert at(text, "（一）").path == "第一章 第一条 （一）"
    assert at(text, "（二）").path == "第一章 第一条 （二）"
    assert at(text, "正文继续").path == "第一章 第一条 （二）"  # unlabelled: the path in force
    assert at(text, "第二条").path == "第一章 第二条"
    assert at(text, "第三条").path == "第二章 第三条"


def test_english_paths():
    text = "ARTICLE 2 SERVICES\n2.4 Restrictions. Customer shall not:\n(a) copy the Platform;\n(b) resell it.\nARTICLE 3 FEES"
    assert at(text, "(b)").path == "ARTICLE 2 2.4 (b)"
    assert at(text, "ARTICLE 3").path == "ARTICLE 3"


def test_empty_and_blank_texts_have_no_anchors_but_their_first_line_is_one():
    assert find_anchors("") == []
    assert find_anchors("\n\n  \n") == []
    assert [(a.char, a.kind) for a in find_anchors("第一条 总则")] == [(0, "marker")]
