"""The handlers' own error paths, without a cluster."""

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from operators.config import OperatorConfig
from operators.handlers import _read_qps


def test_an_unreachable_redis_reads_as_missing_data_with_the_error():
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))  # nothing listens on port 1
    reading, error = _read_qps(client, OperatorConfig(), "h100", 1000.0)
    assert (reading.qps, reading.newest_bucket_age_s) == (None, None)
    assert error


def test_operator_command_refuses_a_non_positive_interval():
    import pytest

    from k25.cli import main

    with pytest.raises(SystemExit, match="--interval"):
        main(["operator", "--interval", "0"])
