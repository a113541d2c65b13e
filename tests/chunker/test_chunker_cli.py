"""`k25 chunk`, `k25 bench chunk` and the start-up errors of `k25 chunker`."""

import json
import socket
import subprocess
import sys

import pytest

from k25.cli import main
from tests.helpers.paths import CONTRACTS

CONTRACTS = CONTRACTS
LICENSE = CONTRACTS / "zh_software_license.txt"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_chunk_prints_the_passages_as_json(capsys):
    code, out, _ = run_cli(capsys, "chunk", "--passage-tokens", "200", "--overlap-ratio", "0", str(LICENSE))
    assert code == 0
    passages = json.loads(out)["chunks"]  # the output's key keeps its name
    assert set(json.loads(out)) == {"chunks"}
    assert all(set(p) == {"start_char", "end_char", "start_token", "end_token", "anchor"} for p in passages)
    text = LICENSE.read_text(encoding="utf-8")
    # no overlap: the passages' texts put together are the file's text
    assert "".join(text[p["start_char"] : p["end_char"]] for p in passages) == text
    assert all(p["end_token"] - p["start_token"] <= 200 for p in passages)
    assert any(p["anchor"].endswith("第十二条") for p in passages)


def test_chunk_size_is_still_accepted_as_the_old_name_of_passage_tokens(capsys):
    outputs = [run_cli(capsys, "chunk", flag, "200", str(LICENSE)) for flag in ("--passage-tokens", "--chunk-size")]
    assert outputs[0][0] == outputs[1][0] == 0
    assert outputs[0][1] == outputs[1][1]


def test_chunk_reads_standard_input_in_a_real_process():
    text = "第一条 总则。\n第二条 定义。\n"
    result = subprocess.run(
        [sys.executable, "-m", "k25.cli", "chunk", "-"], input=text.encode(), capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr.decode()
    [passage] = json.loads(result.stdout)["chunks"]
    assert (passage["start_char"], passage["end_char"], passage["anchor"]) == (0, len(text), "第一条")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["chunk", "/no/such/file.txt"], "/no/such/file.txt: cannot read"),
        (["chunk", "--chunk-size", "8", str(LICENSE)], "passage_tokens (chunk_size) must be between 16"),
        (["chunk", "--passage-tokens", "8", str(LICENSE)], "passage_tokens (chunk_size) must be between 16"),
        (["chunk", "--overlap-ratio", "0.9", str(LICENSE)], "overlap_ratio must be between 0 and 0.5"),
        (["chunk", "--semantic-threshold", "1.5", str(LICENSE)], "semantic_threshold must be between 0 and 1"),
        (["chunk", "--model", "/no/such/model.gguf", str(LICENSE)], "/no/such/model.gguf"),
        (["chunker", "--max-document-bytes", "0"], "--max-document-bytes must be positive"),
        (["chunker", "--stuck-after-s", "0"], "--stuck-after-s must be positive"),
        (["chunker", "--stuck-after-s", "nan"], "--stuck-after-s must be positive"),
        (["chunker", "--chunk-size", "4"], "passage_tokens (chunk_size) must be between 16"),
        (["chunker", "--passage-tokens", "4"], "passage_tokens (chunk_size) must be between 16"),
        (["bench", "chunk", "--repeats", "0", str(LICENSE)], "--repeats must be at least 1"),
        (["bench", "chunk", "/no/such/file.txt"], "/no/such/file.txt: cannot read"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, fragment):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and fragment in err


def test_a_file_that_is_not_utf8_is_refused(capsys, tmp_path):
    path = tmp_path / "gbk.txt"
    path.write_bytes("第一条 总则".encode("gbk"))
    code, _, err = run_cli(capsys, "chunk", str(path))
    assert code == 2 and "not UTF-8 text (byte 0" in err


@pytest.mark.parametrize("flag", ["--zmq-port", "--metrics-port"])
def test_chunker_refuses_a_port_in_use(capsys, flag):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        other = "--metrics-port" if flag == "--zmq-port" else "--zmq-port"
        code, _, err = run_cli(capsys, "chunker", flag, port, other, "0")
    assert code == 2 and f"port {port}" in err


def test_bench_chunk_reports_speed_and_split_rates(capsys):
    files = [str(p) for p in sorted(CONTRACTS.glob("*.txt"))]
    code, out, _ = run_cli(capsys, "bench", "chunk", "--repeats", "1", "--split-chunk-sizes", "128", "256", "--json", *files)
    assert code == 0
    result = json.loads(out)
    assert result["documents"] == len(files) and result["tokens"] > 10_000
    assert result["k25_speed"]["mb_per_s"] > 0 and result["fixed_speed"]["chunks_per_s"] > 0
    # the JSON keeps its names: chunk_size is the passage budget
    assert result["speed_params"] == {"chunk_size": 512, "overlap_ratio": 0.1, "semantic_threshold": 0.5}
    by_size = {r["chunk_size"]: r for r in result["split_rates"]}
    assert set(by_size) == {128, 256}
    for r in by_size.values():
        assert r["k25_split_rate_of_fitting"] == 0.0
        assert r["fixed_split_rate"] > r["k25_split_rate"]
        assert r["clauses_that_fit"] <= r["clauses"]
    assert by_size[128]["clauses_that_fit"] < by_size[256]["clauses_that_fit"]


def test_bench_chunk_prints_a_table(capsys):
    code, out, _ = run_cli(capsys, "bench", "chunk", str(LICENSE), "--repeats", "1", "--split-chunk-sizes", "256")
    assert code == 0
    assert "MB/s" in out and "chunks/s" in out and "clause split rate" in out
