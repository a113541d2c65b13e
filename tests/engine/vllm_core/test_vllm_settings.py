"""engine/vllm_core/settings.py: what K25's settings become for vLLM, without vLLM."""

import pytest

from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.core.sampling_params import Constraint, SamplingParams
from engine.model.loader import TINY_CONFIG as TINY
from engine.vllm_core.model_shape import ModelShape, shape_from_config
from engine.vllm_core.settings import (
    BLOCK_SIZE,
    NULL_BLOCKS,
    NodeGroup,
    engine_args,
    kv_bytes_per_token,
    omp_threads_bind,
    plan_kv,
    sampling_kwargs,
    vllm_dtype,
)

TINY_CONFIG = ModelShape(TINY.num_layers, TINY.num_kv_heads, TINY.head_dim, TINY.vocab_size,
                         TINY.max_position_embeddings, TINY.num_parameters())


def test_the_shape_is_read_from_any_architectures_config():
    mixtral = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
               "vocab_size": 100, "max_position_embeddings": 4096, "num_local_experts": 4}
    assert shape_from_config(mixtral, 7) == ModelShape(2, 2, 64, 100, 4096, 7)
    no_gqa = {"text_config": {"num_hidden_layers": 1, "num_attention_heads": 8, "hidden_size": 512, "head_dim": 32,
                              "vocab_size": 10}}
    assert shape_from_config(no_gqa, 0) == ModelShape(1, 8, 32, 10, 2048, 0)


@pytest.mark.parametrize("requested, device, flags, expected", [
    ("auto", "cuda", frozenset(), "bfloat16"),
    ("auto", "cpu", frozenset({"avx2", "avx512_bf16"}), "bfloat16"),
    ("auto", "cpu", frozenset({"avx2", "amx_bf16"}), "bfloat16"),
    ("auto", "cpu", frozenset({"avx2", "avx512f"}), "float32"),  # vLLM emulates bf16 there
    ("float32", "cuda", frozenset(), "float32"),
    ("bfloat16", "cpu", frozenset({"avx2"}), "bfloat16"),
])
def test_dtype_follows_the_device_not_a_stopwatch(requested, device, flags, expected):
    assert vllm_dtype(requested, device, flags) == expected


def test_kv_holds_exactly_max_chunk_per_gpu_chunks():
    config = EngineConfig(chunk_size=64, max_chunk_per_gpu=40)
    plan = plan_kv(config, TINY_CONFIG, "float32")
    assert plan.max_chunk_per_gpu == 40
    assert (plan.blocks - NULL_BLOCKS) * BLOCK_SIZE == 40 * 64
    assert plan.cpu_kv_gib * (1 << 30) >= plan.blocks * BLOCK_SIZE * kv_bytes_per_token(TINY_CONFIG, "float32")


def test_a_capacity_that_does_not_fit_names_the_largest_that_does():
    config = EngineConfig(chunk_size=256, max_chunk_per_gpu=10**6, cpu_memory_budget_gib=1.0)
    chunk_bytes = 256 * kv_bytes_per_token(TINY_CONFIG, "float32")
    weights = TINY_CONFIG.num_parameters * 4
    largest = ((1 << 30) - weights) // chunk_bytes
    with pytest.raises(EngineConfigError, match=f"the largest max_chunk_per_gpu that fits is {largest}$"):
        plan_kv(config, TINY_CONFIG, "float32")
    assert plan_kv(EngineConfig(chunk_size=256, max_chunk_per_gpu=largest, cpu_memory_budget_gib=1.0),
                   TINY_CONFIG, "float32").max_chunk_per_gpu == largest


@pytest.mark.parametrize("config, message", [
    (EngineConfig(chunk_size=48, max_chunk_per_gpu=2), "multiple of 32"),
    (EngineConfig(chunk_size=64, max_chunk_per_gpu="auto"), "give a number"),
])
def test_refuses_what_it_cannot_honour(config, message):
    with pytest.raises(EngineConfigError, match=message):
        plan_kv(config, TINY_CONFIG, "float32")


def test_engine_args_carry_the_capacity_and_k25s_scheduling_settings():
    config = EngineConfig(chunk_size=64, max_chunk_per_gpu=4, max_num_seqs=7, max_num_batched_tokens=300,
                          prefix_caching=False)
    plan = plan_kv(config, TINY_CONFIG, "float32")
    args = engine_args(config, "/m", "float32", plan, max_model_len=256, tensor_parallel_size=2)
    assert args["num_gpu_blocks_override"] == plan.blocks and args["block_size"] == BLOCK_SIZE
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["enable_prefix_caching"]) == (7, 300, False)
    assert args["tensor_parallel_size"] == 2 and "enable_lora" not in args and not args["enable_expert_parallel"]
    expert = engine_args(EngineConfig(chunk_size=64, max_chunk_per_gpu=4, expert_parallel=True), "/m", "float32", plan, 256)
    assert expert["enable_expert_parallel"]
    with_lora = engine_args(EngineConfig(chunk_size=64, max_chunk_per_gpu=4, max_loras=2, max_cpu_loras=1,
                                         max_lora_rank=16), "/m", "float32", plan, 256)
    assert (with_lora["enable_lora"], with_lora["max_loras"], with_lora["max_cpu_loras"], with_lora["max_lora_rank"]) \
        == (True, 2, 2, 16)


def test_sampling_keeps_ends_with_k25s_rules():
    eos = (2, 0)
    kwargs = sampling_kwargs(SamplingParams(max_tokens=5, stop_token_ids=(9,), stop=("\n",)), eos)
    assert kwargs["stop_token_ids"] == [0, 2, 9] and kwargs["ignore_eos"] and not kwargs["detokenize"]
    assert "stop" not in kwargs  # stop strings: K25's output processor
    assert sampling_kwargs(SamplingParams(ignore_eos=True, stop_token_ids=(9,)), eos)["stop_token_ids"] == [9]
    biased = sampling_kwargs(SamplingParams(logit_bias=((5, -100.0),), logprobs=3, seed=7), eos)
    assert (biased["logit_bias"], biased["logprobs"], biased["seed"]) == ({5: -100.0}, 3, 7)


@pytest.mark.parametrize("kind, key", [("json_schema", "json"), ("regex", "regex"), ("lark", "grammar")])
def test_constraints_become_vllm_structured_outputs(kind, key):
    kwargs = sampling_kwargs(SamplingParams(constraint=Constraint(kind, "x")), ())
    assert kwargs["structured"] == {key: "x"}


def test_omp_threads_bind_takes_the_engines_share_of_its_cpus():
    assert omp_threads_bind({3, 1, 2, 0}, 2) == "0,1"
    assert omp_threads_bind({5, 7}, 8) == "5,7"
    assert omp_threads_bind({0, 1, 2, 3}, 4, ranks=2) == "0,1|2,3"
    assert omp_threads_bind({0, 1}, 1, ranks=2) == "0|1"  # a CPU per rank at least


def test_the_shape_of_a_folder_matches_transformers(tmp_path, tiny_model):
    from transformers import AutoModelForCausalLM

    from engine.vllm_core.model_shape import read_shape
    from tests.helpers.parity import save_random_llama

    folder = save_random_llama(tmp_path, tiny_model.tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder)
    shape = read_shape(str(folder))
    assert shape.num_parameters == reference.num_parameters()
    config = reference.config
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (
        config.num_hidden_layers, config.num_key_value_heads, config.hidden_size // config.num_attention_heads)


def test_a_node_group_reaches_vllm_as_its_multi_node_settings_and_a_lone_node_adds_none():
    config = EngineConfig(chunk_size=64, max_chunk_per_gpu=4, pipeline_parallel_size=2)
    plan = plan_kv(config, TINY_CONFIG, "float32")
    alone = engine_args(config, "/m", "float32", plan, 256, tensor_parallel_size=4)
    assert (alone["pipeline_parallel_size"], alone["tensor_parallel_size"]) == (2, 4)
    assert not {"nnodes", "node_rank", "master_addr", "master_port", "distributed_executor_backend"} & set(alone)
    second = engine_args(config, "/m", "float32", plan, 256, 4, group=NodeGroup(2, 1, "big-engine-0.big-engine.s"))
    assert {k: v for k, v in second.items() if alone.get(k) != v} == {
        "nnodes": 2, "node_rank": 1, "master_addr": "big-engine-0.big-engine.s", "master_port": 29501,
        "distributed_executor_backend": "mp"}  # vLLM's multiprocessing executor across nodes: no Ray


def test_a_node_waits_for_the_first_to_go_before_it_stops(tmp_path):
    """After SIGTERM a headless node serves on while node 0 drains, until its master port closes."""
    import socket
    import threading

    from engine.vllm_core.headless import answers, outlive_leader

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stopped = threading.Event()
    waiting = threading.Thread(target=outlive_leader, args=("127.0.0.1", port, stopped.set, 0.05))
    waiting.start()
    assert answers("127.0.0.1", port, 1.0) and not stopped.wait(0.3)  # node 0 still there: serving on
    listener.close()
    waiting.join(timeout=30)
    assert stopped.is_set() and not answers("127.0.0.1", port, 1.0)
