"""A request's crash budget, without servers: the first engine it loses is replaced, the
second refuses it (a query of death must not crash the fleet engine by engine).
tests/gateway/test_gateway_query_of_death.py shows it with real engines that die."""

import logging
import time

import pytest

from proto import k25_pb2
from services.gateway.dispatch import MAX_ENGINES_LOST, Job, crash_budget_spent


def job() -> Job:
    return Job(request_id="cmpl-qod", tenant="t", model="m", prompt_token_ids=[5, 6],
               sampling=k25_pb2.SamplingParams(max_tokens=4), deadline=time.time() + 60)


def test_one_lost_engine_is_tried_again_and_the_second_is_the_last():
    assert MAX_ENGINES_LOST == 2
    assert [crash_budget_spent(n) for n in range(4)] == [False, False, True, True]


def test_the_second_lost_engine_refuses_the_request_logged_with_its_id(caplog):
    request = job()
    request.lose_engine("a")
    with caplog.at_level(logging.ERROR, logger="services.gateway.dispatch"), pytest.raises(Exception) as refused:
        request.lose_engine("b")
    error = refused.value
    assert error.status == 502 and error.type == "server_error" and error.code == "request_crashed_engines"
    assert "cmpl-qod" in error.message and "2 times" in error.message
    assert error.headers == {"x-should-retry": "false"}  # OpenAI's clients would send it again otherwise
    assert request.engines_lost == ["a", "b"]
    [record] = caplog.records
    assert "cmpl-qod" in record.getMessage() and "a, b" in record.getMessage()
