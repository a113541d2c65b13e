"""The gateway's KV event listener against a real Redis: events reach the index, garbage on
the channel is skipped and counted, and the listener keeps listening."""

from common.redis_keys import kv_events_channel
from proto import k25_pb2
from services.gateway.held_prefix import HeldRun
from services.gateway.kv_event_listener import KVEventListener
from services.gateway.prefix_index import PrefixIndex
from tests.helpers.engine_process import wait_until
from tests.helpers.redis_server import free_port, redis_client, redis_server  # noqa: F401  (fixtures)


def test_events_reach_the_index_and_garbage_is_skipped(redis_client):
    index = PrefixIndex(100)
    listener = KVEventListener(redis_client, "rel", index)
    listener.start()
    try:
        channel = kv_events_channel("rel")
        wait_until(lambda: redis_client.pubsub_numsub(channel)[0][1] == 1, what="the listener subscribed")
        redis_client.publish(channel, b"\xff\xff not a protobuf")
        redis_client.publish(channel, k25_pb2.KVEvents(incarnation="i1", stored=[1]).SerializeToString())  # no engine
        redis_client.publish(channel, k25_pb2.KVEvents(engine_id="e1", incarnation="i1", stored=[4, 5]).SerializeToString())
        wait_until(lambda: listener.applied == 1, what="the good event applied")
        assert listener.unreadable == 2
        assert index.matched_blocks([4, 5]) == {"e1": HeldRun(2, 0, 0)}
    finally:
        listener.stop()
