"""Model building blocks over the kernels: linears (dense or quantized, merged,
tensor-parallel), the vocab-parallel embedding, RMSNorm, rotary cache, paged attention."""
from engine.model.layers.attention import ForwardContext, PagedAttention, forward_context, get_forward_context
from engine.model.layers.embedding import VocabParallelEmbedding
from engine.model.layers.linear import DENSE, Dense, Linear, make_linear
from engine.model.layers.norm import GemmaRMSNorm, RMSNorm
from engine.model.layers.rotary import ROPE_TYPES, rope_cache, rope_inv_freq

__all__ = [
    "DENSE", "Dense", "ForwardContext", "GemmaRMSNorm", "Linear", "PagedAttention", "RMSNorm", "ROPE_TYPES", "VocabParallelEmbedding",
    "forward_context", "get_forward_context", "make_linear", "rope_cache", "rope_inv_freq",
]
