import pytest

from operators.pool_spec import GPU_TAINT_TOLERATION, PoolSpecError, parse_pool_spec

MINIMAL = {"nodeType": "A100-40G", "model": "m", "chunkSize": 1024}


def test_defaults_follow_the_node_type():
    spec = parse_pool_spec(MINIMAL)
    assert spec.max_chunk_per_gpu == 2
    assert (spec.gpus_per_replica, spec.tolerations) == (1, (GPU_TAINT_TOLERATION,))
    assert (spec.min_replicas, spec.max_replicas, spec.target_qps_per_replica) == (1, 4, 80.0)
    assert (spec.scale_up_window_s, spec.scale_down_window_s) == (0, 300)
    assert parse_pool_spec({**MINIMAL, "nodeType": "A100-80G"}).max_chunk_per_gpu == 4
    assert parse_pool_spec({**MINIMAL, "nodeType": "H100-80G"}).max_chunk_per_gpu == 8


def test_profiled_node_types_leave_max_chunk_to_the_engine():
    assert parse_pool_spec({**MINIMAL, "nodeType": "H200"}).max_chunk_per_gpu is None
    cpu = parse_pool_spec({**MINIMAL, "nodeType": "CPU"})
    assert (cpu.max_chunk_per_gpu, cpu.gpus_per_replica, cpu.tolerations) == (None, 0, ())


def test_an_explicit_value_wins_over_the_node_type_default():
    assert parse_pool_spec({**MINIMAL, "maxChunkPerGpu": 3}).max_chunk_per_gpu == 3


def test_scaling_rules_carry_the_spec():
    rules = parse_pool_spec({**MINIMAL, "minReplicas": 0, "maxReplicas": 9, "targetQPSPerReplica": 2.5,
                             "scaleUpStabilizationSeconds": 15, "scaleDownStabilizationSeconds": 60}).scaling_rules()
    assert (rules.min_replicas, rules.max_replicas, rules.target_qps_per_replica) == (0, 9, 2.5)
    assert (rules.scale_up_window_s, rules.scale_down_window_s) == (15, 60)


@pytest.mark.parametrize("replicas, initial", [(None, 2), (0, 2), (3, 3), (50, 6)])
def test_initial_replicas_are_spec_replicas_within_bounds(replicas, initial):
    spec = {**MINIMAL, "minReplicas": 2, "maxReplicas": 6}
    if replicas is not None:
        spec["replicas"] = replicas
    assert parse_pool_spec(spec).initial_replicas() == initial


@pytest.mark.parametrize("bad, message", [
    ({"nodeType": None}, "spec.nodeType is required"),
    ({"model": ""}, "spec.model is required"),
    ({"chunkSize": "big"}, "spec.chunkSize must be an integer"),
    ({"chunkSize": True}, "spec.chunkSize must be an integer"),
    ({"maxChunkPerGpu": 0}, "spec.maxChunkPerGpu must be at least 1"),
    ({"targetQPSPerReplica": -1}, "spec.targetQPSPerReplica must be a positive number"),
    ({"minReplicas": 3, "maxReplicas": 2}, "must not exceed"),
    ({"tolerations": "gpu"}, "list of tolerations"),
    ({"tolerations": [{"effect": "Sometimes"}]}, "unknown effect"),
])
def test_bad_specs_say_which_field(bad, message):
    with pytest.raises(PoolSpecError, match=message):
        parse_pool_spec({**MINIMAL, **bad})
