"""The synchronous engine: load a model, take requests, and step:
schedule, run, postprocess. LLM and AsyncLLMEngine are built on it."""
from __future__ import annotations

import functools
import logging
import time

import torch

from engine.async_scheduling import AsyncScheduling
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer
from engine.distributed import SINGLE
from engine.errors import EngineError, InvalidInputError, NonFiniteLogitsError, OutOfMemoryError, RequestFailedError
from engine.faults import FaultInjector
from engine.input_processor import EngineRequest, InputProcessor
from engine.memory import log_gpu_memory, num_kv_blocks
from engine.model import loader
from engine.model.spec import context_length
from engine.logprobs import TokenDecoder, prompt_rows
from engine.lora.manager import SALT as LORA_SALT
from engine.lora.manager import LoRAManager, check_lora_request
from engine.lora.request import LoRARequest
from engine.outputs import RequestOutput, request_output
from engine.parallel_sampling import ParentRequest, child_id, child_params
from engine.runner import ModelRunner
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, use_long_rope
from engine.sequence import Sequence, SequenceStatus
from engine.spec_decode import verify
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.draft_model import DraftModel
from engine.spec_decode.speculator import Speculator
from engine.structured.masks import MaskFiller, advance
from engine.tokenizer import load_tokenizer
from engine.validation import is_int

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True on CPUs whose matmuls run bfloat16 natively (AVX512-BF16 or AMX-BF16): there
    bfloat16 decodes about 1.5-1.8x faster than float32 (benchmarks/cpu.py, C1)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:  # not Linux: no way to tell, so the safe float32
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """auto: bfloat16 on CUDA and on CPUs with native bfloat16 matmuls, else float32."""
    if dtype == "auto":
        native = device.startswith("cuda") or (device == "cpu" and cpu_has_native_bf16())
        return torch.bfloat16 if native else torch.float32
    return DTYPES[dtype]


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's torch dtype (EngineConfig.kv_cache_dtype; auto: the model's)."""
    fp8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    if kv_cache_dtype == "auto":
        return dtype
    return fp8.get(kv_cache_dtype) or DTYPES[kv_cache_dtype]


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        path = loader.resolve_model_path(config.model, config.revision)
        self.model_path = path
        spec = loader.read_model_spec(path, config.quantization)  # before any weight
        self.spec = spec
        self.max_model_len = context_length(spec, config.max_model_len, config.allow_long_max_model_len)
        self.tokenizer = load_tokenizer(config.tokenizer or path, config.tokenizer_revision or
                                        (None if config.tokenizer else config.revision))
        if config.chat_template:
            self.tokenizer.chat_template = config.chat_template
        torch.manual_seed(config.seed)
        self.workers = None  # the other ranks under tensor parallelism (engine.parallel)
        tp = SINGLE
        if config.tensor_parallel_size > 1:
            from engine.parallel.launcher import TPWorkers

            self.workers = TPWorkers.start(config, spec, path, self.max_model_len, self.dtype, self.device)
            tp = self.workers.tp
        t0 = time.monotonic()
        self.faults = FaultInjector(config.fault_injection)
        self.model = loader.load_model(spec, path, self.dtype, self.device, max_positions=self.max_model_len,
                                       load_format=config.load_format, seed=config.seed, tp=tp,
                                       wrap_weights=self.faults.wrap_weights, name=config.model)
        log.info("loaded %s (%s, %s) in %.1fs", config.served_model_name or config.model, self.dtype, self.device,
                 time.monotonic() - t0)
        budget = config.max_num_batched_tokens or (8192 if self.device.startswith("cuda") else 2048)
        self.max_num_batched_tokens = budget
        make_runner = self.workers.runner if self.workers else ModelRunner  # TP: one runner per rank
        self.runner = make_runner(self.model, config.block_size, self.dtype, self.device,
                                  max_num_seqs=config.max_num_seqs, max_num_batched_tokens=budget,
                                  max_model_len=self.max_model_len,
                                  kv_cache_dtype=resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype))
        # adapters' slots before the KV cache is sized, so their memory is counted (None: enable_lora off)
        self.lora = LoRAManager.for_engine(config, self.model, self.runner, self.dtype, self.device)
        speculative = SpeculativeConfig.from_value(config.speculative_config)
        speculative = speculative.for_engine(self.device, self.dtype) if speculative is not None else None
        self.drafter = DraftModel.for_engine(speculative, self, budget)  # draft_model: its KV in the same blocks
        self.memory: dict = {}
        num_blocks = config.num_kv_blocks or num_kv_blocks(self.runner, config, self.max_model_len, budget, self.memory,
                                                           also=self.drafter.runner if self.drafter else None)
        for runner in [self.runner] + ([self.drafter.runner] if self.drafter else []):
            runner.allocate_kv_cache(num_blocks)
        if self.device.startswith("cuda"):
            if not config.enforce_eager:
                mixed = min(config.max_cudagraph_tokens, budget)
                self.runner.capture_graphs(min(config.max_num_seqs, 512), mixed)  # under TP: every rank its own
            log_gpu_memory(num_blocks, config, self.memory)
        block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                     ttl_s=config.prefix_cache_ttl_s)
        self.scheduler = Scheduler(block_manager, config.max_num_seqs, budget)
        self.scheduler.lora = self.lora
        long_rope = getattr(self.model, "long_rope", None)
        self.scheduler.rope_switch = long_rope[0] if long_rope else None
        windows = [spec.window(i) for i in range(spec.num_layers)]
        if all(windows):  # every layer sliding: a sequence holds only its window's blocks
            self.scheduler.window = max(windows)
        self.eos_token_ids = loader.eos_token_ids(path, spec.eos_token_id, self.tokenizer)
        self.sampler = Sampler(self.eos_token_ids, config.seed)
        self.input_processor = InputProcessor(self.tokenizer, spec.vocab_size, self.max_model_len,
                                              self._kv_capacity(num_blocks, config.block_size, budget),
                                              allow_special_tokens_in_content=config.allow_special_tokens_in_content,
                                              max_logprobs=config.max_logprobs, eos_token_ids=self.eos_token_ids)
        self.masks = MaskFiller(spec.vocab_size, pin=self.device.startswith("cuda"))  # structured output
        self.requests: dict[str, Sequence] = {}
        self.parents: dict[str, ParentRequest] = {}  # requests of n > 1 (or best_of) choices
        self.token_decoder = TokenDecoder(self.tokenizer)  # Logprob.decoded_token
        self.step_count = 0
        self.speculator = Speculator(speculative, self.max_model_len, self.drafter) if speculative is not None else None
        # decode steps launched before the previous one's results are read (engine.async_scheduling);
        # not under tensor parallelism, sliding-window release, longrope's switch or fault injection
        ahead = self.device.startswith("cuda") if config.async_scheduling is None else config.async_scheduling
        self.ahead = AsyncScheduling(self) if (
            ahead and self.workers is None and self.scheduler.window is None
            and self.scheduler.rope_switch is None and not self.faults.spec) else None

    def _kv_capacity(self, num_blocks: int, block_size: int, budget: int) -> int:
        """The longest request the KV cache holds: its blocks, or for a model whose every layer
        slides, any length once a window plus a chunk (and two partial blocks) fits."""
        window = self.scheduler.window
        if window is not None and -(-(window + budget) // block_size) + 2 <= num_blocks:
            return max(num_blocks * block_size, self.max_model_len)
        return num_blocks * block_size

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
        return self.input_processor.kv_capacity_tokens

    @property
    def max_request_tokens(self) -> int:
        """The largest request (prompt + output tokens) one sequence can be."""
        return self.input_processor.max_request_tokens

    @property
    def request_kv_tokens(self) -> int:
        """The most KV tokens one request holds at once: its whole length, or when every layer
        slides, its window, a chunk and two partial blocks (the rest is released as it moves)."""
        longest = self.max_request_tokens
        window = self.scheduler.window
        if window is None:
            return longest
        return min(longest, window + self.max_num_batched_tokens + 2 * self.scheduler.bm.block_size)

    # -- requests ----------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | dict | None = None,
                    priority: int = 0, cache_salt: str | None = None, lora_request: LoRARequest | None = None
                    ) -> Sequence:
        """Queue a request: a prompt (see InputProcessor.encode) with its sampling params,
        or an EngineRequest the input processor made (then params must be None); lora_request:
        the adapter it runs with (LoRAError, before anything is queued, when it cannot)."""
        if request_id in self.requests or request_id in self.parents:
            raise InvalidInputError(f"request id {request_id!r} is already running", field="request_id")
        if not is_int(priority):
            raise InvalidInputError("priority must be an integer", field="priority")
        check_lora_request(self.lora, lora_request)
        if isinstance(prompt, EngineRequest):
            if params is not None:
                raise InvalidInputError("an EngineRequest carries its own sampling params; pass params=None",
                                        field="sampling_params")
            req = prompt
        else:
            req = self.input_processor.process(prompt, params)
        choices = req.params.num_choices
        if choices == 1:
            seq = self._new_seq(request_id, req, req.params, priority, cache_salt, lora_request=lora_request)
            self.scheduler.add(seq)
            return seq
        children = [self._new_seq(child_id(request_id, i), req, child_params(req.params, i), priority, cache_salt, i,
                                  lora_request) for i in range(choices)]
        parent = self.parents[request_id] = ParentRequest(request_id, req.params, children)
        for child in children:
            child.parent = parent
        self.scheduler.add(children[0])  # the others once its prompt is computed (engine.parallel_sampling)
        return children[0]

    def _new_seq(self, request_id: str, req: EngineRequest, params: SamplingParams, priority: int,
                 cache_salt: str | None, index: int = 0, lora_request: LoRARequest | None = None) -> Sequence:
        if lora_request is not None:  # its KV blocks hash apart from the base model's and other adapters'
            cache_salt = f"{cache_salt or ''}{LORA_SALT}{lora_request.lora_int_id}"
        seq = Sequence(request_id, req.prompt, req.prompt_token_ids, params, req.max_tokens, priority=priority,
                       cache_salt=cache_salt, index=index, lora_request=lora_request)
        if self.scheduler.rope_switch is not None and seq.num_tokens > self.scheduler.rope_switch:
            use_long_rope(seq)
        seq.detok = Detokenizer(self.tokenizer, req.prompt_token_ids, params, self.eos_token_ids, req.max_tokens,
                                self.max_model_len)
        if req.grammar is not None:
            seq.matcher = req.grammar.matcher()  # each choice of n its own
            if seq.matcher.is_error():
                raise InvalidInputError(f"structured_outputs: {seq.matcher.get_error()}", field="structured_outputs")
        if params.logprobs is not None:
            seq.logprobs = []
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None]
        if lora_request is not None:
            self.lora.add(lora_request)  # loaded and checked now: LoRAError before anything is queued
        self.requests[request_id] = seq
        return seq

    def abort_request(self, request_id: str) -> RequestOutput | None:
        parent = self.parents.pop(request_id, None)
        if parent is not None:
            for child in parent.children:
                if child.finish_reason is None:
                    self._finish(child)
                    child.finish_reason = "abort"
                parent.update(request_output(child))
            return parent.output()
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        self._finish(seq)
        seq.finish_reason = "abort"
        return request_output(seq)

    def queued_since(self, request_id: str) -> float | None:
        """Since when the request has waited in the engine's queue with no choice of it running:
        its arrival, or its last preemption; None while a step runs it, or when it is unknown."""
        parent = self.parents.get(request_id)
        seqs = parent.children if parent is not None else [self.requests.get(request_id)]
        seqs = [s for s in seqs if s is not None and s.status != SequenceStatus.FINISHED]
        if not seqs or any(s.status == SequenceStatus.RUNNING for s in seqs):
            return None
        return max(s.preempted_time or s.arrival_time for s in seqs)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- step ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine iteration: schedule, run, postprocess. Returns outputs of
        the requests that advanced or finished in this step; under asynchronous scheduling
        a steady decode step's outputs come with the next call, which launches its successor
        first (engine.async_scheduling)."""
        if self.ahead is not None and self.ahead.inflight is not None:
            return self.ahead.step()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)  # drafts, which the scheduler fits to the budget
        sched = self.scheduler.schedule()
        if sched.expired:  # before this step's forward writes into any block reused meanwhile
            self.runner.scrub_kv(sched.expired)
        if not sched:
            return []
        if self.ahead is not None and self.ahead.can_start(sched.scheduled) and self.ahead.start(sched.scheduled):
            return []  # launched and left running: its outputs come with the next call
        if self.drafter is not None:  # the placeholders the scheduler fitted become the draft model's tokens
            sched.scheduled = self.speculator.fill(sched.scheduled)
        self.step_count += 1
        samples, failed = self._execute(sched.scheduled)
        outputs = [self._fail(seq, err) for seq, err in failed]
        gone = {seq for seq, _ in failed}
        ran = [item for item in sched.scheduled if item[0] not in gone] if gone else sched.scheduled
        for seq, sample in self.scheduler.update_from_output(ran, samples):
            outputs.append(self._postprocess(seq, sample))
            if seq.parent is not None and seq.parent.held:  # its prompt is computed: the other choices join
                for child in seq.parent.release():
                    self.scheduler.add(child)
        return self._gather(outputs) if self.parents else outputs

    def _gather(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Children's outputs as their requests' (one per request and step); a failed child
        fails its request (the other children stop)."""
        out, touched = [], {}
        for o in outputs:
            parent = self.parents.get(o.request_id.split("\x00")[0]) if "\x00" in o.request_id else None
            if parent is None:
                out.append(o)
                continue
            parent.update(o)
            touched[parent.request_id] = parent
        for parent in touched.values():
            if parent.failed:
                for child in parent.children:
                    if child.request_id in self.requests:
                        self._finish(child)
            agg = parent.output()
            if agg is not None:
                out.append(agg)
            if parent.finished:
                del self.parents[parent.request_id]
        return out

    def scrub_expired(self) -> int:
        """Between steps (an idle engine): zero the KV of cached blocks whose TTL passed."""
        if self.scheduler.bm.ttl_s is None:
            return 0
        expired = self.scheduler.bm.expire()
        self.runner.scrub_kv(expired)
        return len(expired)

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
        prompt, rows = prompt_rows(scheduled)
        samplers = [(seq, n) for seq, n in scheduled if seq.num_computed_tokens + n >= seq.num_tokens]
        seqs = [s for s, _ in samplers]
        views = verify.rows(seqs) if self.speculator is not None else seqs  # k + 1 rows for a request with k drafts
        pending = self.masks.start(views)  # computed while the forward is launched and runs
        try:
            logits = self.runner.execute(scheduled, prompt_rows=rows) if rows else self.runner.execute(scheduled)
        finally:
            masks = pending.result() if pending is not None else None  # the matchers are free again
        if samplers:
            logits = self.faults.poison_logits(self.step_count, views, logits)
        results = self.sampler.sample(logits, views, prompt, masks=masks) if samplers or prompt is not None else []
        if prompt is not None:
            for (seq, _, _), positions in zip(prompt.entries, prompt.results):
                self.token_decoder.fill(positions)
                seq.prompt_logprobs.extend(positions)
        if views is not seqs:  # per request its accepted run (a list) where it verified drafts
            results = verify.accepted_runs(seqs, results)
            self.speculator.record(seqs, results)
        samples = iter(results)
        return [next(samples) if seq.num_computed_tokens + n >= seq.num_tokens else None for seq, n in scheduled]

    def _empty_cache(self):
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def _postprocess(self, seq: Sequence, sample) -> RequestOutput:
        """A sampled token (or a verify step's accepted run, token by token) through the
        detokenizer and its stop checks; the request's output. A failure here fails this request only."""
        try:
            run = sample if isinstance(sample, list) else (sample,)
            before = seq.num_output_tokens - sum(s.error is None for s in run)  # output tokens before this step's
            for i, s in enumerate(run):
                failed = self._take(seq, s, before + i + 1)
                if failed is not None:
                    return failed
                if seq.finish_reason is not None:  # EOS or a stop inside an accepted run ends it there
                    verify.drop_after_end(seq, run[i + 1 :])
                    break
            return request_output(seq)
        except Exception as exc:  # noqa: BLE001 - one request's failure fails that request only
            log.exception("request %s failed in postprocessing", seq.request_id)
            return self._fail(seq, RequestFailedError(f"request {seq.request_id} failed: {exc}"))

    def _take(self, seq: Sequence, sample, num_output: int) -> RequestOutput | None:
        """The num_output-th output token through the grammar and the detokenizer; the failed
        request's output when it fails."""
        if sample.error is not None:
            return self._fail(seq, NonFiniteLogitsError(f"request {seq.request_id}: {sample.error}"))
        self.faults.before_detokenize(self.step_count, seq)
        if sample.top_logprobs is not None:
            self.token_decoder.fill((sample.top_logprobs,))
        grammar = advance(seq, sample.token_id) if seq.matcher is not None else None
        if grammar == "error":
            return self._fail(seq, RequestFailedError(
                f"request {seq.request_id}: token {sample.token_id} does not match its structured_outputs "
                f"({seq.matcher.get_error()})"))
        end = seq.detok.update(sample.token_id, num_output)
        if end is None and grammar == "done":
            end = seq.detok.complete()
        if end is not None:
            seq.finish_reason, seq.stop_reason = end
            self._finish(seq)
        return None

    def _finish(self, seq: Sequence) -> None:
        known = self.requests.pop(seq.request_id, None) is not None
        self.scheduler.finish(seq)
        if known and seq.lora_request is not None:
            self.lora.remove(seq.lora_request)

    def _fail(self, seq: Sequence, err: EngineError) -> RequestOutput:
        self._finish(seq)
        err.details.setdefault("partial_text", seq.detok.text if seq.detok else "")
        seq.error = err
        seq.finish_reason = "error"
        return request_output(seq)

    # -- stats ----------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            **self.scheduler.stats(),
            "num_steps": self.step_count,
            "num_async_steps": self.ahead.num_steps if self.ahead is not None else 0,
            **(self.speculator.stats() if self.speculator is not None else {}),
            **(self.lora.stats() if self.lora is not None else {}),
            **{k: v for k, v in self.memory.items() if k == "gpu_memory_fraction"},
        }
