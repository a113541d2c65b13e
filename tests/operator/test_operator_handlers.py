"""The handlers' own error paths, without a cluster."""

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from k25.cli import build_parser, main
from operators.config import OperatorConfig
from operators.handlers import _read_qps
from operators.runtime import operator_scope, operator_settings, peering_name


def test_an_unreachable_redis_reads_as_missing_data_with_the_error():
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))  # nothing listens on port 1
    reading, error = _read_qps(client, OperatorConfig(), "h100", 1000.0)
    assert (reading.qps, reading.newest_bucket_age_s) == (None, None)
    assert error


def test_operator_command_refuses_a_non_positive_interval():
    with pytest.raises(SystemExit, match="--interval"):
        main(["operator", "--interval", "0"])


def test_a_redis_password_never_goes_to_the_engines_in_plain_text(monkeypatch):
    monkeypatch.delenv("K25_REDIS_SECRET", raising=False)
    with pytest.raises(ValueError, match="the Redis URL carries a password: name the Secret"):
        OperatorConfig(redis_url="redis://:s3cret@redis:6379/0")
    with pytest.raises(SystemExit, match="--redis-secret"):
        main(["operator", "--redis-url", "rediss://default:s3cret@redis:6380/0"])
    assert OperatorConfig(redis_url="redis://:s3cret@redis:6379/0", redis_secret="k25-redis").redis_secret == "k25-redis"
    assert OperatorConfig(redis_url="redis://redis:6379/0").redis_secret is None  # no password: nothing to hide


def test_the_secret_and_the_url_default_to_the_environment_the_chart_gives(monkeypatch):
    monkeypatch.setenv("K25_REDIS_URL", "redis://:s3cret@prod-k25-redis:6379/0")
    monkeypatch.setenv("K25_REDIS_SECRET", "prod-k25-redis")
    args = build_parser().parse_args(["operator", "--namespace", "serving"])
    assert (args.redis_url, args.redis_secret, args.namespace) == (
        "redis://:s3cret@prod-k25-redis:6379/0", "prod-k25-redis", ["serving"])


def test_the_curve_secret_defaults_to_the_environment_and_without_one_curve_is_off(monkeypatch):
    monkeypatch.setenv("K25_CURVE_SECRET", "prod-k25-transport")
    assert build_parser().parse_args(["operator"]).curve_secret == "prod-k25-transport"
    assert build_parser().parse_args(["operator", "--curve-secret", "mine"]).curve_secret == "mine"
    monkeypatch.setenv("K25_CURVE_SECRET", "")
    assert build_parser().parse_args(["operator"]).curve_secret is None
    assert OperatorConfig().curve_secret is None


def test_each_release_has_its_own_peering_and_a_namespaced_operator_needs_no_cluster_wide_watch():
    assert peering_name("blue") != peering_name("green")
    cluster_wide = operator_scope(OperatorConfig(release="blue"), [], None, standalone=False)
    assert (cluster_wide["clusterwide"], cluster_wide["peering_name"]) == (True, "k25-operator-blue")
    namespaced = operator_scope(OperatorConfig(release="blue"), ["serving"], 7, standalone=False)
    assert (namespaced["clusterwide"], namespaced["namespaces"], namespaced["priority"]) == (False, ["serving"], 7)
    assert operator_settings(namespaced=True).scanning.disabled and not operator_settings().scanning.disabled
    assert operator_scope(OperatorConfig(), [], None, standalone=True)["peering_name"] is None
