"""Compile the CUDA C++ kernels (llm_kernels.awq_mma, llm_kernels.awq_tile) on a machine
without a GPU, as the engine compiles them on one: NVRTC to PTX (pip's
nvidia-cuda-nvrtc-cu12, a test dependency, or the library named by LLM_KERNELS_NVRTC),
then Triton's bundled ptxas to a cubin for a given sm_XX, whose -v log says the registers
and spills. The tests compile every config with it; benchmarks/mma_sass.py reads the SASS.
Nothing here runs at import."""
import ctypes
import glob
import os
import re
import subprocess
import tempfile


def nvrtc_path():
    """libnvrtc.so.12: LLM_KERNELS_NVRTC, else pip's nvidia-cuda-nvrtc-cu12, else None."""
    path = os.environ.get("LLM_KERNELS_NVRTC")
    if path:
        return path
    try:
        import nvidia.cuda_nvrtc as pkg  # noqa: PLC0415 - optional, a test dependency
    except ImportError:
        return None
    for root in list(getattr(pkg, "__path__", [])):
        found = sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so.12*")))
        if found:
            return found[0]
    return None


def ptxas_path():
    """Triton's bundled ptxas, or None."""
    try:
        import triton  # noqa: PLC0415
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return path if os.path.exists(path) else None


def nvrtc_ptx(lib, src: str, name: str, arch: int) -> str:
    """PTX of src for compute_<arch> (lib: the loaded libnvrtc), or RuntimeError with NVRTC's log."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = [f"--gpu-architecture=compute_{arch}".encode(), b"-std=c++17"]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc:
            raise RuntimeError(f"NVRTC: {log.value.decode(errors='replace')}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def ptxas_numbers(log: str) -> dict:
    """Registers, stack and spill bytes from a ptxas -v log."""
    grab = lambda pat: int(m.group(1)) if (m := re.search(pat, log)) else None  # noqa: E731
    return {"regs": grab(r"Used (\d+) registers"), "stack": grab(r"(\d+) bytes stack frame"),
            "spill_st": grab(r"(\d+) bytes spill stores"), "spill_ld": grab(r"(\d+) bytes spill loads")}


def compile_cubin(lib, src: str, name: str, arch: int, cubin: str) -> dict:
    """src -> cubin (a path) for sm_<arch>: ptxas -v's numbers, or {"error": ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(nvrtc_ptx(lib, src, name, arch))
        run = subprocess.run([ptxas_path(), f"-arch=sm_{arch}", "-v", "-o", cubin, ptx], capture_output=True, text=True)
    if run.returncode:
        return {"error": run.stderr[-600:]}
    return ptxas_numbers(run.stderr + run.stdout)
