"""Which adapter is where: a CPU cache of loaded adapters (max_cpu_loras, least recently used
first out, never one a queued request still needs) and the device's max_loras slots (least
recently used first out, never one a running request uses). The scheduler asks acquire() before
it admits a request of an adapter; a request that gets no slot waits, the others go ahead."""
from __future__ import annotations

import logging
from collections import OrderedDict

from engine.errors import InvalidInputError, LoRAError
from engine.lora.adapter import LoRAAdapter, load_adapter
from engine.lora.request import LoRARequest
from engine.lora.slots import LoRASlots
from engine.lora.targets import LoRATargets

log = logging.getLogger(__name__)

SALT = "\x00lora:"  # appended to a request's cache salt: two adapters never share KV blocks


class LoRAManager:
    def __init__(self, model, max_loras: int, max_lora_rank: int, max_cpu_loras: int, dtype, device):
        self.targets = LoRATargets(model)
        self.max_rank, self.max_cpu, self.dtype = max_lora_rank, max_cpu_loras, dtype
        self.slots = LoRASlots(self.targets, max_loras, max_lora_rank, dtype, device)
        self.cpu: OrderedDict[int, LoRAAdapter] = OrderedDict()  # lora_int_id -> adapter, LRU first
        self.users: dict[int, int] = {}  # lora_int_id -> requests queued or running with it
        self.slot_of: dict[int, int] = {}  # lora_int_id -> its slot
        self.in_slot: list[int | None] = [None] * max_loras  # slot -> lora_int_id
        self.refs = [0] * max_loras  # slot -> running sequences using it
        self.lru: OrderedDict[int, None] = OrderedDict()  # slots by last use, oldest first
        self.loads = self.evictions = 0

    @classmethod
    def for_engine(cls, config, model, runner, dtype, device) -> LoRAManager | None:
        """The engine's manager when config.enable_lora (its runner then gives each token its slot)."""
        if not config.enable_lora:
            return None
        manager = cls(model, config.max_loras, config.max_lora_rank, config.max_cpu_loras or config.max_loras,
                      dtype, device)
        runner.lora = True
        log.info("LoRA: %d slots of rank %d (%.1f MiB)", config.max_loras, config.max_lora_rank,
                 manager.slots.nbytes / 2**20)
        return manager

    # -- requests ------------------------------------------------------------------------
    def cached(self, request: LoRARequest) -> bool:
        return request.lora_int_id in self.cpu

    def load(self, request: LoRARequest) -> LoRAAdapter:
        """Read and check an adapter, changing nothing here (safe on another thread)."""
        return load_adapter(request, self.targets, self.max_rank, self.dtype)

    def put(self, adapter: LoRAAdapter) -> None:
        """An adapter load() read, cached for the add() that follows (unless one is cached by now)."""
        if adapter.request.lora_int_id not in self.cpu:
            self.cpu[adapter.request.lora_int_id] = adapter
            self.loads += 1

    def add(self, request: LoRARequest) -> LoRAAdapter:
        """A request of this adapter arrives: loaded (and checked) now if it is not cached, so a
        bad adapter fails the request before it is queued. LoRAError names what is wrong."""
        adapter = self.cpu.get(request.lora_int_id)
        if adapter is not None and adapter.request.lora_path != request.lora_path:
            raise LoRAError(f"lora_int_id {request.lora_int_id} is {adapter.request.lora_name!r} "
                            f"({adapter.request.lora_path}), not {request.lora_path}: one id names one adapter",
                            adapter=request.lora_name, reason="id_conflict")
        if adapter is None:
            adapter = self.load(request)
            self.cpu[request.lora_int_id] = adapter
            self.loads += 1
            log.info("LoRA adapter %s loaded from %s (rank %d, %d linears)", request.lora_name, request.lora_path,
                     adapter.rank, len(adapter.pairs))
        self.cpu.move_to_end(request.lora_int_id)
        self.users[request.lora_int_id] = self.users.get(request.lora_int_id, 0) + 1
        self._trim_cpu()
        return adapter

    def remove(self, request: LoRARequest) -> None:
        """A request of this adapter ended (its sequences released their slots first)."""
        left = self.users.get(request.lora_int_id, 0) - 1
        if left > 0:
            self.users[request.lora_int_id] = left
        else:
            self.users.pop(request.lora_int_id, None)
            self._trim_cpu()

    def _trim_cpu(self) -> None:
        for lora_id in list(self.cpu):
            if len(self.cpu) <= self.max_cpu:
                break
            if lora_id not in self.users and lora_id not in self.slot_of:
                del self.cpu[lora_id]

    # -- slots -----------------------------------------------------------------------------
    def can_acquire(self, lora_id: int) -> bool:
        return lora_id in self.slot_of or any(r == 0 for r in self.refs)

    def acquire(self, lora_id: int) -> int | None:
        """A slot holding the adapter for one more running sequence, loading it into a free slot or
        the least recently used idle one; None when every slot is in use (the request waits)."""
        slot = self.slot_of.get(lora_id)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            old = self.in_slot[slot]
            if old is not None:
                del self.slot_of[old]
                self.evictions += 1
                self._trim_cpu()
            self.slots.write(slot, self.cpu[lora_id])
            self.in_slot[slot], self.slot_of[lora_id] = lora_id, slot
        self.refs[slot] += 1
        self.lru.pop(slot, None)
        self.lru[slot] = None
        return slot

    def _free_slot(self) -> int | None:
        for slot, held in enumerate(self.in_slot):
            if held is None:
                return slot
        return next((slot for slot in self.lru if self.refs[slot] == 0), None)

    def release(self, slot: int) -> None:
        assert self.refs[slot] > 0, "a LoRA slot released more often than acquired"
        self.refs[slot] -= 1

    def stats(self) -> dict:
        return {"lora_slots_used": sum(h is not None for h in self.in_slot), "lora_slots_total": len(self.in_slot),
                "lora_adapters_cached": len(self.cpu), "lora_loads": self.loads, "lora_evictions": self.evictions}


def check_lora_request(manager: LoRAManager | None, lora_request) -> None:
    """A request's lora_request is a LoRARequest, and adapters are enabled when it names one."""
    if lora_request is None:
        return
    if not isinstance(lora_request, LoRARequest):
        raise InvalidInputError("lora_request must be an engine.LoRARequest", field="lora_request")
    if manager is None:
        raise InvalidInputError(f"LoRA adapter {lora_request.lora_name!r} requested but adapters are not "
                                "enabled (enable_lora=True)", field="lora_request")
