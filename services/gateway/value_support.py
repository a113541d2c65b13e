"""Whether a passage supports an extracted value: every string in the value occurs in the
passage's text, and every number occurs there as a number; where each occurs.

Both sides are compared normalised (Unicode compatibility forms, case, quotes and dashes,
runs of white space), and a match must not cut a word: "Ohio" does not occur in "Ohioan".
A number matches the same number written with thousands separators ("1,000,000") or in a
parenthesis ("thirty (30) days"), not one written in words. A boolean, or a value with no
string or number in it, cannot be found in a text, so it is never supported. Pure functions."""

import re
import unicodedata
from decimal import Decimal, InvalidOperation

_SAME = str.maketrans({"‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"', "–": "-", "—": "-", "‐": "-"})
# a number not inside a word or another number (CJK may touch it: "人民币100万元")
_NUMBER = re.compile(r"(?<![0-9A-Za-z_.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![0-9A-Za-z_]|,\d)")
# what a value's string may carry around its words that the text need not
_EDGES = " \t\n.,;:"


class Unsupported(Exception):
    """The value holds something the passage does not."""


def normalised(text: str) -> tuple[str, list[int]]:
    """The text compared, and for each of its characters the offset of the character of `text`
    it came from."""
    out, origin = [], []
    space = True  # white space at the start is dropped, and runs of it become one space
    for i, ch in enumerate(text):
        for c in unicodedata.normalize("NFKC", ch).casefold().translate(_SAME):
            if c.isspace():
                if space:
                    continue
                c, space = " ", True
            else:
                space = False
            out.append(c)
            origin.append(i)
    return "".join(out), origin


def _is_word(ch: str) -> bool:
    # CJK has no spaces between words, so any cut of it is a word boundary
    return ch.isalnum() and ord(ch) < 0x2E80


def _string_span(needle: str, haystack: str, origin: list[int]) -> tuple[int, int]:
    words, _ = normalised(needle)
    words = words.strip(_EDGES)
    if not words:
        raise Unsupported("an empty string")
    at = haystack.find(words)
    while at >= 0:
        end = at + len(words)
        cuts_before = at > 0 and _is_word(haystack[at - 1]) and _is_word(words[0])
        cuts_after = end < len(haystack) and _is_word(haystack[end]) and _is_word(words[-1])
        if not (cuts_before or cuts_after):
            return origin[at], origin[end - 1] + 1
        at = haystack.find(words, at + 1)
    raise Unsupported(f"{needle!r} is not in the passage")


def _number_span(number: float, text: str) -> tuple[int, int]:
    wanted = Decimal(str(number))
    for match in _NUMBER.finditer(text):
        try:
            if Decimal(match.group().replace(",", "")) == wanted:
                return match.span()
        except InvalidOperation:
            continue
    raise Unsupported(f"{number!r} is not in the passage")


def numbers_in(text: str) -> list[int | float]:
    """The numbers written in the text, in order ("1,000,000.00" is 1000000)."""
    found = []
    for match in _NUMBER.finditer(text):
        try:
            number = Decimal(match.group().replace(",", ""))
        except InvalidOperation:
            continue
        found.append(int(number) if number == number.to_integral_value() else float(number))
    return found


def leaves(value) -> list:
    """The strings and numbers in a value, in order; raises Unsupported for a boolean."""
    if isinstance(value, bool):
        raise Unsupported("a boolean cannot be found in a text")
    if isinstance(value, str | int | float):
        return [value]
    if isinstance(value, list):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    return []  # null


def support(value, passage_text: str) -> list[tuple[int, int]]:
    """Where in the passage (character spans) each string and number of the value occurs;
    raises Unsupported when one does not, or when the value has none."""
    found = leaves(value)
    if not found:
        raise Unsupported("the value holds no text")
    haystack, origin = normalised(passage_text)
    return [_string_span(leaf, haystack, origin) if isinstance(leaf, str) else _number_span(leaf, passage_text)
            for leaf in found]


def same_value(a, b) -> bool:
    """Whether two supported values say the same, compared as the passages are."""
    return [_compared(leaf) for leaf in leaves(a)] == [_compared(leaf) for leaf in leaves(b)]


def _compared(leaf: str | float) -> str | Decimal:
    return normalised(leaf)[0].strip(_EDGES) if isinstance(leaf, str) else Decimal(str(leaf))
