"""The weight bytes one decode step reads, by layer type: each projection once (one copy,
quantised or packed), the head once plus the rows its best logits are computed again from,
one embedding row a token, the norms. Embeddings are only gathered, so their width saves
memory, not reads."""

from engine.model.llama import REFINED_LOGITS, LlamaModel


def _row_bytes(rows) -> int:
    """Bytes of one row of an embedding-like table (a tensor, or engine/quant's Int8Embedding)."""
    return rows.row_bytes if hasattr(rows, "row_bytes") else rows.shape[1] * rows.element_size()


def decode_weight_bytes(model: LlamaModel) -> dict[str, int]:
    """{"embed", "attn", "mlp", "head", "norms"} -> bytes one decode step of one sequence reads."""
    read = {"embed": _row_bytes(model.embed_tokens), "attn": 0, "mlp": 0, "norms": model.norm.nbytes}
    for layer in model.layers:
        read["attn"] += layer.qkv.read_bytes + layer.o.read_bytes
        read["attn"] += sum(b.nbytes for b in (layer.qkv_bias, layer.o_bias) if b is not None)
        read["mlp"] += layer.gate_up.read_bytes + layer.down.read_bytes
        read["norms"] += layer.input_norm.nbytes + layer.post_attention_norm.nbytes
    refined = REFINED_LOGITS * _row_bytes(model.head_rows) if model.dtype != model.norm.dtype else 0
    read["head"] = model.lm_head.read_bytes + refined
    return read
