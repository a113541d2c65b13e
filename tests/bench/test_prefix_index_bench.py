"""`k25 bench prefix-index`: the figures it prints follow from what it filled the index with."""

import json

from k25.cli import main


def test_the_bound_holds_and_the_memory_is_counted(capsys):
    assert main(["bench", "prefix-index", "--blocks", "5000", "--max-blocks", "2000", "--engines", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["held_blocks"], report["evicted_blocks"]) == (2000, 3000)
    # an entry holds at least its 8-byte hash as a Python int (28 bytes or more) and a dict slot
    assert report["bytes_per_block"] > 28 + 8
    assert report["lookup_us"] > 0 and report["apply_us_per_hash"] > 0


def test_bad_sizes_are_refused(capsys):
    assert main(["bench", "prefix-index", "--max-blocks", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
