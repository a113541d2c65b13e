"""Documents written to hurt the chunker: every one is cut, in time linear in its length.

A pattern that backtracks (a stop followed by `\\W*$`, searched from every stop of a run of
them) made 300,000 dots and a hard-wrapped `x\\ny` take about 17 minutes here, fourfold per
doubling. The check is a wall-clock bound no linear cut comes near and no quadratic one can
meet: the documents below are ten times the issue's, which a quadratic cut takes hours on, and
a linear one well under a second each."""

import re
import subprocess
import sys
import textwrap

from hypothesis import given
from hypothesis import strategies as st

from common.anchors import _ends_a_sentence
from tests.helpers.paths import REPO

# runs of characters that the anchor patterns treat specially, each repeated to a long line
# that a lower-case line then continues
RUNS = [".", ";", "。", ". ", ";)", ".\"", ", ", " ", "1.", "(a)", "#", "第", "subject to "]
LENGTH = 1_000_000  # characters per document: over three times the issue's
# what a linear cut of them all takes, many times over; a quadratic one takes hours
BOUND_S = 600

CUT_EVERY_RUN = textwrap.dedent(f"""
    from common.tokenizer import load_tokenizer
    from common.anchors import find_anchors
    from services.chunker.boundaries import ChunkParams
    from services.chunker.chunker import Chunker
    for run in {RUNS!r}:
        assert find_anchors(run * ({LENGTH} // len(run)) + "x\\ny"), run
    text = "." * {LENGTH} + "x\\ny"  # the issue's document, longer
    passages = Chunker(load_tokenizer("smollm2-135m")).split(text, ChunkParams()).passages
    assert passages[0].start_char == 0 and passages[-1].end_char == len(text)
    print(len(passages))
""")


def test_documents_of_long_runs_are_cut_in_linear_time():
    done = subprocess.run([sys.executable, "-c", CUT_EVERY_RUN], cwd=REPO, capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 1


STOP_AT_END = re.compile(r"[.;:!?。；：！？]\W*$")  # the pattern that backtracked, for its meaning


@given(st.text(alphabet=st.sampled_from(list(".;:!?。；：！？ _-)\"”a1条\t")) | st.characters(), max_size=40))
def test_the_sentence_end_check_means_what_the_backtracking_pattern_meant(line):
    assert _ends_a_sentence(line) == bool(STOP_AT_END.search(line))
