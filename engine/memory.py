"""How many KV-cache blocks the engine gets: on CUDA, the memory left within
gpu_memory_utilization once the weights, the CUDA context and a profiled
full-budget step are counted; on the CPU, a few full contexts."""
from __future__ import annotations

import logging

import torch

from engine.errors import ModelLoadError

log = logging.getLogger(__name__)

GRAPH_RESERVE_BYTES = 256 * 2**20  # the decode CUDA graphs' memory pool
CPU_MAX_BYTES = 4 * 2**30


def kv_bytes_per_block(spec, block_size: int, dtype) -> int:
    """K and V of every layer for one block of tokens (spec: the model's, this rank's heads)."""
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * torch.empty((), dtype=dtype).element_size()


def mixed_graph_reserve(peak: int, budget: int, graph_tokens: int) -> int:
    """Memory for the mixed-step graphs (engine.mixed_graphs), an estimate: the profiled
    full-budget step's activation peak scaled to the graphs' largest token count, plus 256 MiB
    for what does not scale with tokens (a dequantized weight of the large-M GEMMs)."""
    if not graph_tokens:
        return 0
    return int(peak * graph_tokens / budget) + GRAPH_RESERVE_BYTES


def num_kv_blocks(runner, config, max_model_len: int, max_num_batched_tokens: int, memory: dict, also=None) -> int:
    """Blocks for the KV cache; the CUDA figures it weighed go into `memory`. The profiled
    forward runs here (a full token budget over max_num_seqs sequences, all sampling).
    also: another runner whose KV cache shares the blocks (a draft model's): its bytes count too."""
    per_block = kv_bytes_per_block(runner.model.spec, config.block_size, runner.kv_cache_dtype)
    if also is not None:
        per_block += kv_bytes_per_block(also.model.spec, config.block_size, also.kv_cache_dtype)
    if runner.device.type == "cuda":
        peak = runner.profile_peak_bytes(max_num_batched_tokens, config.max_num_seqs)
        free, total = torch.cuda.mem_get_info()
        in_use = total - free  # weights, CUDA context, cuBLAS workspaces, other processes
        graphs = 0 if config.enforce_eager else GRAPH_RESERVE_BYTES + mixed_graph_reserve(
            peak, max_num_batched_tokens, min(config.max_cudagraph_tokens, max_num_batched_tokens))
        budget = total * config.gpu_memory_utilization - in_use - peak - graphs
        memory.update(total_bytes=total, in_use_before_kv_bytes=in_use, activation_peak_bytes=peak,
                      kv_budget_bytes=max(0, int(budget)))
    else:
        want = max(4 * max_model_len, 16384) // config.block_size * per_block
        budget = min(want, CPU_MAX_BYTES)
    blocks = int(budget // per_block)
    if blocks < 1:
        raise ModelLoadError(
            f"no memory is left for the KV cache: {budget / 2**30:.2f} GiB within gpu_memory_utilization="
            f"{config.gpu_memory_utilization} after the weights and a forward of "
            f"{max_num_batched_tokens} tokens; raise gpu_memory_utilization or lower max_num_batched_tokens")
    return blocks


def log_gpu_memory(num_blocks: int, config, memory: dict) -> None:
    """After the KV cache and graphs exist: the share of GPU memory in use, into `memory` and the log."""
    free, total = torch.cuda.mem_get_info()
    memory["gpu_memory_fraction"] = (total - free) / total
    log.info("KV cache: %d blocks of %d tokens; GPU memory in use: %.1f%% of %.1f GiB "
             "(gpu_memory_utilization %.2f)", num_blocks, config.block_size,
             100 * memory["gpu_memory_fraction"], total / 2**30, config.gpu_memory_utilization)
