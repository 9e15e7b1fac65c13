"""The runpod SDK's start-up fitness checks, chosen deliberately. runpod 1.12 runs them once
before the first job take, in production only (RUNPOD_WEBHOOK_GET_JOB set), and ends the
process with os._exit(1) at the first that fails: memory (RUNPOD_MIN_MEMORY_GB) and disk
(RUNPOD_MIN_DISK_PERCENT), a TCP connection to 8.8.8.8:53, and with a GPU the CUDA version,
CUDA's initialization and a short matmul benchmark.

The worker needs no public DNS server: it reaches RunPod's job API at the URLs RunPod gives
it, and a model named by MODEL_NAME has loaded (from the hub, a volume or the host's cache)
before the checks run; the embedded default model is baked into the image. So on a network
that blocks 8.8.8.8 the SDK's network check would kill a worker that serves fine; here it
only logs a warning. Every
other check keeps the SDK's own code and its fatal failure. RUNPOD_SKIP_AUTO_SYSTEM_CHECKS=true
set by the user still skips them all, as the SDK documents."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("handler")

SKIP = "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS"


def configure_fitness_checks() -> list[str]:
    """Register the SDK's system checks ourselves, the network one as a warning, and keep the
    SDK from registering its own set. Returns the registered checks' names (none when the
    user skipped them)."""
    if os.environ.get(SKIP, "").lower() == "true":
        return []
    from runpod.serverless.modules import rp_fitness
    from runpod.serverless.modules import rp_system_fitness as system

    os.environ[SKIP] = "true"  # the SDK's set (with its fatal network check) stays out

    def memory() -> None:
        system._check_memory_availability()

    def disk() -> None:
        system._check_disk_space()

    async def public_network() -> None:
        try:
            await system._check_network_connectivity()
        except Exception as exc:  # noqa: BLE001 - any failure is only a warning here
            log.warning("no public network (%s): the worker needs none, serving on", exc)

    checks = [memory, disk, public_network]
    if system.gpu_available():
        async def cuda_version() -> None:
            await system._check_cuda_versions()

        async def cuda_init() -> None:
            await system._check_cuda_initialization()

        async def gpu_benchmark() -> None:
            await system._check_gpu_compute_benchmark()

        checks += [cuda_version, cuda_init, gpu_benchmark]
    for check in checks:
        rp_fitness.register_fitness_check(check)
    return [c.__name__ for c in checks]
