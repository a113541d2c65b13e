"""engine.serve.kv_events against a real Redis: what gateways receive on the release's channel."""

import redis

from common.redis_keys import kv_events_channel
from engine.core.contract import DEVICE, DISK, HOST
from engine.serve.kv_events import KVEventPublisher
from proto import k25_pb2
from tests.helpers.engine_process import wait_until
from tests.helpers.redis_server import free_port, redis_client, redis_server  # noqa: F401  (fixtures)


def subscribed(client: redis.Redis, release: str):
    pubsub = client.pubsub()
    pubsub.subscribe(kv_events_channel(release))
    wait_until(lambda: pubsub.get_message(timeout=0.1), what="subscription confirmed")
    return pubsub


def received(pubsub) -> list[k25_pb2.KVEvents]:
    messages = []
    while (message := pubsub.get_message(timeout=0.2)) is not None:
        messages.append(k25_pb2.KVEvents.FromString(message["data"]))
    return messages


def test_first_message_clears_then_changes_arrive_batched(redis_client):
    pubsub = subscribed(redis_client, "rel")
    publisher = KVEventPublisher(redis_client, "rel", "e1", "inc-1")
    assert publisher.publish_pending()
    publisher.add({1: DEVICE, 2: DEVICE})
    publisher.add({3: DEVICE, 1: None})
    assert publisher.publish_pending()
    assert publisher.publish_pending()  # nothing gathered: nothing sent
    first, second = received(pubsub)
    assert (first.engine_id, first.incarnation, first.cleared, list(first.stored)) == ("e1", "inc-1", True, [])
    # each hash in its latest state: 1 was cached, then evicted from every tier
    assert (second.cleared, list(second.stored), list(second.removed)) == (False, [2, 3], [1])
    assert publisher.published == 2


def test_blocks_below_the_device_are_removed_and_named_by_tier(redis_client):
    pubsub = subscribed(redis_client, "rel")
    publisher = KVEventPublisher(redis_client, "rel", "e1", "inc-1")
    publisher.add({1: DEVICE, 2: DEVICE, 3: DEVICE})
    publisher.add({2: HOST, 3: HOST})
    publisher.add({3: DISK, 4: None})  # 3 left host memory for disk only
    publisher.add({5: HOST})
    publisher.add({5: DEVICE})  # brought back before the message left: on the device
    assert publisher.publish_pending()
    (message,) = received(pubsub)
    assert sorted(message.stored) == [1, 5] and sorted(message.removed) == [2, 3, 4]
    assert (list(message.host), list(message.disk)) == ([2], [3])


def test_too_many_waiting_changes_are_dropped_and_gateways_told_to_forget(redis_client):
    pubsub = subscribed(redis_client, "rel")
    publisher = KVEventPublisher(redis_client, "rel", "e1", "inc-1", max_pending=4)
    publisher.publish_pending()
    publisher.add(dict.fromkeys([1, 2, 3], DEVICE))
    publisher.add(dict.fromkeys([4, 5], DEVICE))  # past the bound
    publisher.publish_pending()
    _, after = received(pubsub)
    assert after.cleared and list(after.stored) == []


def test_redis_down_drops_changes_and_the_next_message_clears(redis_server):
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)  # nothing listens
    publisher = KVEventPublisher(client, "rel", "e1", "inc-1")
    publisher.add(dict.fromkeys([1, 2], DEVICE))
    assert not publisher.publish_pending()
    publisher.client = redis.Redis.from_url(redis_server)
    pubsub = subscribed(publisher.client, "rel")
    publisher.add({7: DEVICE})
    assert publisher.publish_pending()
    (message,) = received(pubsub)
    assert message.cleared and list(message.stored) == [7]


def test_stop_tells_gateways_to_forget_this_engine(redis_client):
    pubsub = subscribed(redis_client, "rel")
    publisher = KVEventPublisher(redis_client, "rel", "e1", "inc-1", interval_s=0.01)
    publisher.start()
    publisher.add({5: DEVICE})
    messages: list[k25_pb2.KVEvents] = []
    wait_until(lambda: messages.extend(received(pubsub)) or any(m.stored for m in messages), what="the change published")
    publisher.stop()
    messages += received(pubsub)
    assert messages[-1].cleared and list(messages[-1].stored) == []
    assert [h for m in messages for h in m.stored] == [5]
