"""`k25 gateway` flags for pools, waiting for engines and weighing their errors: defaults,
and flags that cannot work refused before anything loads."""

import pytest

from k25.cli import build_parser


def test_the_defaults():
    args = build_parser().parse_args(["gateway"])
    assert (args.pools, args.engine_wait_s, args.engine_error_window_s, args.chunker_timeout_s) == ([], 30.0, 30.0, 60.0)


def test_a_document_question_reads_at_most_256_passages_by_default():
    assert build_parser().parse_args(["gateway"]).max_document_passages == 256


def test_pools_are_read_as_name_and_chunk_size():
    args = build_parser().parse_args(["gateway", "--pool", "short=2048", "--pool", "long=8192"])
    assert args.pools == [("short", 2048), ("long", 8192)]


@pytest.mark.parametrize("flags, message", [
    (["--pool", "a=64", "--pool", "a=128"], "each --pool needs its own name"),
    (["--engine-wait-s", "-1"], "--engine-wait-s must not be negative"),
    (["--engine-wait-s", "nan"], "--engine-wait-s must not be negative"),
    (["--engine-error-window-s", "0"], "--engine-error-window-s must be positive"),
    (["--max-document-passages", "0"], "--max-document-passages must be at least 1"),
    (["--body-timeout-s", "0"], "--body-timeout-s must be positive"),
    (["--chunker-timeout-s", "0"], "--chunker-timeout-s must be positive"),
    (["--chunker-timeout-s", "nan"], "--chunker-timeout-s must be positive"),
    (["--stream-stall-s", "0"], "--stream-stall-s must be positive"),
    (["--stream-stall-s", "nan"], "--stream-stall-s must be positive"),
    (["--max-body-bytes", "1000", "--max-body-bytes-in-flight", "999"],
     "--max-body-bytes-in-flight must be at least --max-body-bytes (or no body of that size could ever be read)"),
])
def test_flags_that_cannot_work_are_refused_before_anything_loads(flags, message, capsys):
    args = build_parser().parse_args(["gateway", *flags])
    assert args.handler(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"k25 gateway: {message}"


@pytest.mark.parametrize("spec", ["short", "short=", "=64", "short=0", "short=x"])
def test_a_pool_that_is_not_name_equals_chunk_size_is_refused(spec, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["gateway", "--pool", spec])
    assert exited.value.code == 2 and "expected NAME=CHUNK_SIZE" in capsys.readouterr().err
