"""Process-group and RNG setup that Megatron-core needs before a model can be built.

Seer's trainer is one process with tensor / pipeline parallel size 1: gloo on CPU, NCCL on a GPU.
The rendezvous is a file:// store in a fresh temp dir, so concurrent runs on one machine never
race for a TCP port.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def init_megatron(seed: int = 0) -> None:
    """Initialise torch.distributed (world size 1), Megatron's parallel state and its RNG tracker.

    Safe to call more than once per process: an existing process group and parallel state are
    reused, and the RNG tracker is re-seeded.
    """
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        from seer.compat.megatron_cpu_shim import apply_cpu_shim

        apply_cpu_shim()
    if not dist.is_initialized():
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        store_dir = tempfile.mkdtemp(prefix="seer-trainer-pg-")
        dist.init_process_group(
            backend="nccl" if on_gpu else "gloo",
            init_method=f"file://{os.path.join(store_dir, 'store')}",
            world_size=1,
            rank=0,
        )
    if dist.get_world_size() != 1:
        raise RuntimeError("the Seer trainer runs with world size 1 (tp = pp = dp = 1)")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    if on_gpu:
        model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    else:
        from seer.compat.megatron_cpu_shim import seed_cpu_rng_tracker

        seed_cpu_rng_tracker(seed)
