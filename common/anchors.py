"""Where a contract or filing may be cut, and how good a cut each place is.

`find_anchors(text)` returns the places, in text order, where a passage could open: numbered
articles and clauses, headings, defined terms, paragraph and line starts, and, inside a
line, sentence ends, provisos and commas. Each has a strength in 0..1 (the constants
below); the boundary choice (boundaries.py) cuts at the strongest places it can.

Every anchor also carries `path`: the numbering in force where it stands (e.g.
"第三章 第十二条 （二）" or "ARTICLE 4 4.2 (a)"), kept as a stack in which a marker replaces
every marker of its own strength or weaker. A passage reports the path where it opens.
"""

import re
from dataclasses import dataclass

HEADING = 1.0  # 第X章/编, Part, Chapter, Schedule/Exhibit, "# " headings
SECTION = 0.9  # 第X节, "## " headings
ARTICLE = 0.8  # 第X条, Article N, Section N, Item 1A, "1." top-level numbers
ENUMERATION = 0.75  # 一、
TITLE = 0.7  # a short line without punctuation, or one in ALL CAPS
CLAUSE = 0.6  # （一）, 1.1, Section 4.2, Clause 7
SUBCLAUSE = 0.5  # (a), (iv), （1）, 1), 1、, 1.1.1, defined terms opening a line
PARAGRAPH = 0.4  # a line after a blank line
LINE = 0.3  # any other line start; the weakest whole-line anchor
PROVISO = 0.25  # a sentence opening with "Notwithstanding", "除非另有规定", ...
SENTENCE = 0.2  # after 。！？； or . ! ? ; followed by a new sentence
REFERENCE = 0.15  # a cross-reference phrase inside a sentence: "subject to", "本协议约定"
PHRASE = 0.1  # after a comma

_HAN_DIGITS = "一二三四五六七八九十百千零〇两"
_HAN_NUMBER = rf"[{_HAN_DIGITS}\d]+"
_ROMAN = r"[IVXLC]+"

# (pattern at the start of a line, strength); the first that matches wins, its text is the label
_LINE_MARKERS = [
    (rf"第{_HAN_NUMBER}[章编]|第{_HAN_NUMBER}部分|附件{_HAN_NUMBER}?|附录{_HAN_NUMBER}?", HEADING),
    (rf"(?i:part|chapter|schedule|exhibit|annex|appendix)\s+(?:{_ROMAN}|\d+|[A-Z])\b", HEADING),
    (r"#(?!#)", HEADING),
    (rf"第{_HAN_NUMBER}节", SECTION),
    (r"##(?!#)", SECTION),
    (rf"第{_HAN_NUMBER}条", ARTICLE),
    (rf"(?i:article)\s+(?:{_ROMAN}|\d+)\b|(?i:section)\s+\d+\b(?!\.\d)|(?i:item)\s+\d+[A-Z]?\.?", ARTICLE),
    (r"\d+[.．](?=\s|[^\d\s.．])", ARTICLE),
    (r"###+", ARTICLE),
    (r"[一二三四五六七八九十]+、", ENUMERATION),
    (rf"[（(][{_HAN_DIGITS}]+[）)]", CLAUSE),
    (r"(?i:section)\s+\d+\.\d+(?:\([a-z0-9]+\))*|(?i:clause)\s+\d+(?:\.\d+)*|\d+\.\d+(?![.\d])", CLAUSE),
    (r"\d+\.\d+\.\d+(?:\.\d+)*|[（(]\d+[）)]|\d+[)）、]|\((?:[a-z]|[ivx]+)\)|(?:[a-z]|[ivx]+)\)", SUBCLAUSE),
]
_LINE_MARKER = re.compile("|".join(f"(?P<m{i}>{pattern})" for i, (pattern, _) in enumerate(_LINE_MARKERS)))

# a line that opens with a quoted term being defined
_DEFINITION = re.compile(r"""([“"「][^”"」\n]{1,60}[”"」])\s*(?:,\s*)?(?:means|shall mean|has the meaning|refers to|是指|系指|指)""")
_SENTENCE_STOPS = frozenset(".;:!?。；：！？")
_TITLE_PUNCTUATION = re.compile(r"[。，；：！？,.;:!?]")
_TITLE_MAX_CHARS = 60
_LABEL_MAX_CHARS = 60

_PROVISOS = (
    "notwithstanding", "subject to", "provided that", "provided, however", "except as otherwise",
    "unless otherwise", "除非另有规定", "除非本协议另有约定", "除本协议另有约定外", "尽管有前述规定",
    "尽管有上述规定", "本协议约定", "但是", "但",
)
_PROVISO = re.compile("|".join(re.escape(p) for p in _PROVISOS), re.IGNORECASE)
_REFERENCE = re.compile(
    r"(?<=[\s,，])(?:(?i:subject to|notwithstanding|in accordance with|pursuant to|as defined in)\b)"
    r"|(?:本协议约定|除非另有规定|依照本协议|根据本协议|按照本协议)"
)
# sentence ends: Chinese punctuation (closing quotes stay with it), or English punctuation,
# spaces, then something that can open a sentence
_SENTENCE_END = re.compile(r"[。！？；][”’」』）)]*|[.!?;][\"'”’)\]]*\s+(?=[A-Z“\"(\d])")
_COMMA = re.compile(r"[，、]|,\s+")


@dataclass(frozen=True)
class Anchor:
    char: int  # where a passage opening here starts (code point offset)
    strength: float
    kind: str
    label: str = ""  # the numbering or heading text, for markers only
    path: str = ""  # the labels in force here, this anchor's own included


def find_anchors(text: str) -> list[Anchor]:
    """The text's anchors in order, one per position (the strongest found there)."""
    strongest: dict[int, Anchor] = {}
    for anchor in (*_line_anchors(text), *_inline_anchors(text)):
        known = strongest.get(anchor.char)
        if known is None or anchor.strength > known.strength:
            strongest[anchor.char] = anchor
    return _with_paths([strongest[c] for c in sorted(strongest)])


def _line_anchors(text: str):
    previous_blank, previous_line = True, ""
    position = 0
    for line in text.split("\n"):
        content = line.strip()
        if content:
            start = position + len(line) - len(line.lstrip())
            if not _continues(previous_line, content, previous_blank):
                yield _classify_line(start, content, previous_blank)
            previous_line = content
        previous_blank = not content
        position += len(line) + 1


def _continues(previous_line: str, content: str, after_blank: bool) -> bool:
    """A hard-wrapped line: the one before stops mid-sentence and this one goes on in lower case."""
    return not after_blank and content[0].islower() and not _ends_a_sentence(previous_line)


def _ends_a_sentence(line: str) -> bool:
    """The line's closing run of non-word characters (`\\W*$`) holds a stop: "end." or 'end.")'.
    One pass from the end: a regex search for a stop followed by that run tries it from every
    stop of a run of them, quadratic in the run's length (300,000 dots froze the chunker)."""
    for char in reversed(line):
        if char in _SENTENCE_STOPS:
            return True
        if char.isalnum() or char == "_":  # \w, as re reads it in a str pattern
            return False
    return False


def _classify_line(start: int, content: str, after_blank: bool) -> Anchor:
    marker = _LINE_MARKER.match(content)
    if marker:
        strength = _LINE_MARKERS[marker.lastindex - 1][1]
        label = marker.group().strip()
        if label.startswith("#"):  # a markdown heading is labelled by its text
            label = content.lstrip("#").strip()
        return Anchor(start, strength, "marker", label[:_LABEL_MAX_CHARS])
    definition = _DEFINITION.match(content)
    if definition:
        return Anchor(start, SUBCLAUSE, "definition", definition.group(1))
    if _is_title(content):
        return Anchor(start, TITLE, "title", content[:_LABEL_MAX_CHARS])
    return Anchor(start, PARAGRAPH if after_blank else LINE, "paragraph" if after_blank else "line")


def _is_title(content: str) -> bool:
    if len(content) > _TITLE_MAX_CHARS or _TITLE_PUNCTUATION.search(content):
        return False
    letters = [c for c in content if c.isalpha()]
    return bool(letters) and (content.isupper() or not any(c.isascii() for c in letters) or len(content) <= 40)


def _inline_anchors(text: str):
    for match in _SENTENCE_END.finditer(text):
        start = match.end()
        if start >= len(text) or text[start] == "\n":
            continue  # a line start is anchored already
        proviso = _PROVISO.match(text, start)
        yield Anchor(start, PROVISO if proviso else SENTENCE, "proviso" if proviso else "sentence")
    for match in _REFERENCE.finditer(text):
        yield Anchor(match.start(), REFERENCE, "reference")
    for match in _COMMA.finditer(text):
        if match.end() < len(text) and text[match.end()] != "\n":
            yield Anchor(match.end(), PHRASE, "phrase")


def _with_paths(anchors: list[Anchor]) -> list[Anchor]:
    stack: list[Anchor] = []
    result = []
    for anchor in anchors:
        if anchor.label:
            while stack and stack[-1].strength <= anchor.strength:
                stack.pop()
            stack.append(anchor)
        path = " ".join(a.label for a in stack)
        result.append(Anchor(anchor.char, anchor.strength, anchor.kind, anchor.label, path))
    return result
