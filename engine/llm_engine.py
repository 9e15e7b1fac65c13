"""The synchronous engine: load a model, take requests, and step:
schedule, run, postprocess. LLM and AsyncLLMEngine are built on it."""
from __future__ import annotations

import logging
import time

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.faults import FaultInjector
from engine.errors import (
    EngineError,
    InvalidInputError,
    KVCapacityError,
    ModelLoadError,
    NonFiniteLogitsError,
    OutOfMemoryError,
    PromptTooLongError,
    RequestFailedError,
)
from engine.model import loader
from engine.model.llama import LlamaForCausalLM
from engine.parallel.group import SINGLE
from engine.outputs import CompletionOutput, RequestOutput
from engine.runner import ModelRunner, kv_bytes_per_block
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.stop import StopChecker
from engine.tokenizer import IncrementalDetokenizer, load_tokenizer

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[dtype]


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        path = loader.resolve_model_path(config.model, config.revision)
        self.model_path = path
        spec = loader.read_model_spec(path, config.max_model_len, config.quantization)  # before any weight
        self.spec = spec
        self.max_model_len = config.max_model_len or spec.max_position_embeddings
        self.tokenizer = load_tokenizer(config.tokenizer or path, config.revision)
        torch.manual_seed(config.seed)
        self.workers = None  # the other ranks under tensor parallelism (engine.parallel)
        tp = SINGLE
        if config.tensor_parallel_size > 1:
            from engine.parallel.launcher import TPWorkers

            self.workers = TPWorkers.start(config, spec, path, self.max_model_len, self.dtype, self.device)
            tp = self.workers.tp
        t0 = time.monotonic()
        try:
            self.faults = FaultInjector(config.fault_injection)
            model = LlamaForCausalLM(spec, self.dtype, self.device, max_positions=self.max_model_len, tp=tp)
            if config.load_format == "dummy":
                model.init_dummy_weights(config.seed)
            else:
                weights = loader.iter_weights(loader.safetensors_files(path), "cpu")
                model.load_weights(self.faults.wrap_weights(weights))
        except ModelLoadError:
            raise
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"weights of {config.model!r} could not be loaded: {exc}") from exc
        self.model = model.eval()
        log.info("loaded %s (%s, %s) in %.1fs", config.model, self.dtype, self.device, time.monotonic() - t0)
        budget = config.max_num_batched_tokens or (8192 if self.device.startswith("cuda") else 2048)
        self.max_num_batched_tokens = budget
        make_runner = self.workers.runner if self.workers else ModelRunner  # TP: one runner per rank
        self.runner = make_runner(self.model, config.block_size, self.dtype, self.device,
                                  max_num_seqs=config.max_num_seqs, max_num_batched_tokens=budget,
                                  max_model_len=self.max_model_len)
        self.memory: dict = {}
        num_blocks = config.num_kv_blocks or self._blocks_from_memory()
        self.runner.allocate_kv_cache(num_blocks)
        if self.device.startswith("cuda") and not config.enforce_eager:
            from engine.cuda_graph import DecodeGraphs

            if self.workers is not None:
                self.runner.capture_graphs(min(config.max_num_seqs, 512))  # every rank its own
            else:
                self.runner.graphs = DecodeGraphs(self.runner, min(config.max_num_seqs, 512))
                self.runner.graphs.capture()
        if self.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info()
            self.memory["gpu_memory_fraction"] = (total - free) / total
            log.info("KV cache: %d blocks of %d tokens; GPU memory in use: %.1f%% of %.1f GiB "
                     "(gpu_memory_utilization %.2f)", num_blocks, config.block_size,
                     100 * self.memory["gpu_memory_fraction"], total / 2**30, config.gpu_memory_utilization)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                          ttl_s=config.prefix_cache_ttl_s)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, budget)
        self.eos_token_ids = loader.eos_token_ids(path, spec.eos_token_id, self.tokenizer)
        self.sampler = Sampler(self.eos_token_ids, config.seed)
        self.requests: dict[str, Sequence] = {}
        self.step_count = 0
        self.num_failed_oom = 0

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (idempotent)."""
        workers = getattr(self, "workers", None)
        if workers is not None:
            workers.close()

    def __del__(self):
        self.close()

    # -- sizing -----------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_manager.num_blocks * self.config.block_size

    def _blocks_from_memory(self) -> int:
        """On CUDA: the memory left within gpu_memory_utilization once the weights,
        the CUDA context and the peak of a forward at the full token budget are
        counted (that forward is run here to measure it). On the CPU: enough for
        a few full contexts, at most 4 GiB."""
        per_block = kv_bytes_per_block(self.model, self.config.block_size, self.dtype)
        if self.device.startswith("cuda"):
            peak = self.runner.profile_peak_bytes(self.max_num_batched_tokens, self.config.max_num_seqs)
            free, total = torch.cuda.mem_get_info()
            in_use = total - free  # weights, CUDA context, cuBLAS workspaces, other processes
            graphs = 0 if self.config.enforce_eager else 256 * 2**20
            budget = total * self.config.gpu_memory_utilization - in_use - peak - graphs
            self.memory.update(total_bytes=total, in_use_before_kv_bytes=in_use, activation_peak_bytes=peak,
                               kv_budget_bytes=max(0, int(budget)))
        else:
            want = max(4 * self.max_model_len, 16384) // self.config.block_size * per_block
            budget = min(want, 4 * 2**30)
        blocks = int(budget // per_block)
        if blocks < 1:
            raise ModelLoadError(
                f"no memory is left for the KV cache: {budget / 2**30:.2f} GiB within gpu_memory_utilization="
                f"{self.config.gpu_memory_utilization} after the weights and a forward of "
                f"{self.max_num_batched_tokens} tokens; raise gpu_memory_utilization or lower max_num_batched_tokens")
        return blocks

    # -- requests ----------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None,
                    priority: int = 0, cache_salt: str | None = None) -> Sequence:
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidInputError("params must be SamplingParams", field="sampling_params")
        if request_id in self.requests:
            raise InvalidInputError(f"request id {request_id!r} is already running", field="request_id")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InvalidInputError("priority must be an integer", field="priority")
        text, ids = self._prompt_ids(prompt)
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len)
        capacity = self.kv_capacity_tokens
        if len(ids) + 1 > capacity:
            raise KVCapacityError(len(ids) + 1, capacity)
        room = min(self.max_model_len, capacity) - len(ids)
        if params.max_tokens is None:
            max_tokens = room
        else:
            max_tokens = min(params.max_tokens, self.max_model_len - len(ids))
            if len(ids) + max_tokens > capacity:
                raise KVCapacityError(len(ids) + max_tokens, capacity)
        seq = Sequence(request_id, text, ids, params, max_tokens, priority=priority, cache_salt=cache_salt)
        seq.detok = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
        seq.stop_checker = StopChecker(params.stop, params.include_stop_str_in_output)
        if params.logprobs is not None:
            seq.logprobs = []
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInputError("prompt is empty", field="prompt")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise InvalidInputError("prompt_token_ids must be a non-empty list of integers", field="prompt_token_ids")
            bad = [t for t in ids if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise InvalidInputError(
                    f"prompt_token_ids has ids outside the vocabulary (size {self.spec.vocab_size}): {bad[:3]}",
                    field="prompt_token_ids",
                )
            return prompt.get("prompt"), list(ids)
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self._prompt_ids(prompt["prompt"])
        raise InvalidInputError("prompt must be a string or {'prompt_token_ids': [...]}", field="prompt")

    def abort_request(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq)
        seq.finish_reason = "abort"
        return self._output(seq)

    def is_queued(self, request_id: str) -> bool:
        """True while the request waits for its first step (never for one that
        ran and was preempted): how long this lasts is the engine's queueing."""
        seq = self.requests.get(request_id)
        return seq is not None and seq.first_scheduled_time is None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- step ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine iteration: schedule, run, postprocess. Returns outputs of
        the requests that advanced or finished in this step."""
        if self.block_manager.ttl_s is not None:
            self.block_manager.expire()
        sched = self.scheduler.schedule()
        if not sched:
            return []
        self.step_count += 1
        now = time.monotonic()
        for seq, _ in sched.scheduled:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        results, failed = self._execute(sched.scheduled)
        outputs = [self._fail(seq, err) for seq, err in failed]
        for (seq, n), sample in zip([s for s in sched.scheduled if s[0] not in dict(failed)], results):
            outputs.extend(self._postprocess(seq, n, sample))
        return [o for o in outputs if o is not None]

    def _execute(self, scheduled):
        """Samples for scheduled requests; on out-of-memory, the step is retried
        one request at a time and a request that fails alone fails with out_of_memory."""
        try:
            return self._run(scheduled), []
        except torch.OutOfMemoryError:
            log.warning("out of memory in a step of %d requests; retrying them one at a time", len(scheduled))
            self._empty_cache()
        results, failed = [], []
        for item in scheduled:
            try:
                results.extend(self._run([item]))
            except torch.OutOfMemoryError:
                self._empty_cache()
                failed.append((item[0], OutOfMemoryError(
                    f"out of memory running request {item[0].request_id} alone "
                    f"({item[1]} tokens, context {item[0].num_computed_tokens + item[1]})")))
        return results, failed

    def _run(self, scheduled):
        self.faults.before_run(self.step_count, scheduled)
        logits = self.runner.execute(scheduled)
        samplers = [(seq, n) for seq, n in scheduled if seq.num_computed_tokens + n == seq.num_tokens]
        if samplers:
            logits = self.faults.poison_logits(self.step_count, [s for s, _ in samplers], logits)
        samples = iter(self.sampler.sample(logits, [s for s, _ in samplers]) if samplers else [])
        return [next(samples) if seq.num_computed_tokens + n == seq.num_tokens else None for seq, n in scheduled]

    def _empty_cache(self):
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def _postprocess(self, seq: Sequence, n: int, sample):
        try:
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
            if sample is None:
                return [None]  # a prefill chunk: nothing to report yet
            if sample.error is not None:
                return [self._fail(seq, NonFiniteLogitsError(f"request {seq.request_id}: {sample.error}"))]
            if seq.first_token_time is None:
                seq.first_token_time = time.monotonic()
            token = sample.token_id
            seq.token_ids.append(token)
            seq.cumulative_logprob += sample.logprob
            if seq.logprobs is not None:
                seq.logprobs.append(sample.top_logprobs)
            self.faults.before_detokenize(self.step_count, seq)
            self._check_finish(seq, token)
            if seq.finish_reason is not None:
                self.requests.pop(seq.request_id, None)
                self.scheduler.finish(seq)
            return [self._output(seq)]
        except Exception as exc:  # noqa: BLE001 - one request's failure fails that request only
            log.exception("request %s failed in postprocessing", seq.request_id)
            return [self._fail(seq, RequestFailedError(f"request {seq.request_id} failed: {exc}"))]

    def _check_finish(self, seq: Sequence, token: int):
        p = seq.params
        is_eos = token in self.eos_token_ids and not p.ignore_eos
        if is_eos or token in p.stop_token_ids:  # the sampler bans both before min_tokens
            seq.finish_reason, seq.stop_reason = "stop", (None if is_eos else token)
            seq.detok.flush()
            return
        if p.detokenize:
            seq.detok.add(token)
        if seq.num_output_tokens >= p.min_tokens:
            hit = seq.stop_checker.check(seq.detok.text)
            if hit is not None:
                seq.finish_reason, seq.stop_reason = "stop", hit
                return
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            seq.detok.flush()
            seq.finish_reason = "length"

    def _fail(self, seq: Sequence, err: EngineError) -> RequestOutput:
        self.requests.pop(seq.request_id, None)
        self.scheduler.finish(seq)
        err.details.setdefault("partial_text", seq.detok.text if seq.detok else "")
        seq.error = err
        seq.finish_reason = "error"
        return self._output(seq)

    def _output(self, seq: Sequence) -> RequestOutput:
        finished = seq.finish_reason is not None
        text = seq.stop_checker.visible_text(seq.detok.text, finished)
        delta = text[seq.emitted_len :]
        seq.emitted_len = len(text)
        comp = CompletionOutput(
            index=0,
            text=text,
            token_ids=list(seq.output_token_ids),
            cumulative_logprob=seq.cumulative_logprob,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            finish_reason=seq.finish_reason if seq.finish_reason != "error" else None,
            stop_reason=seq.stop_reason,
            delta_text=delta,
        )
        now = time.monotonic()
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            outputs=[comp],
            finished=finished,
            num_cached_tokens=seq.num_cached_prompt_tokens,
            metrics={
                "arrival_time": seq.arrival_time,
                "first_token_time": seq.first_token_time,
                "finished_time": now if finished else None,
                "num_preemptions": seq.num_preemptions,
            },
            error=seq.error,
        )

    # -- stats ----------------------------------------------------------------------
    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "kv_block_size": bm.block_size,
            "prefix_cache_hit_tokens": bm.hit_tokens,
            "prefix_cache_query_tokens": bm.query_tokens,
            "prefix_cache_hit_rate": bm.hit_tokens / bm.query_tokens if bm.query_tokens else 0.0,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": self.step_count,
            **{k: v for k, v in self.memory.items() if k == "gpu_memory_fraction"},
        }
