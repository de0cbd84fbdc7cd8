"""The only place Seer bends Megatron-core to run without CUDA.

Megatron-core assumes a GPU in two spots that a CPU run reaches:
  * the tensor-parallel RNG tracker stores and restores *CUDA* generator states, and
  * rotary embeddings and attention move tensors to ``torch.cuda.current_device()``.
``apply_cpu_shim()`` swaps in a tracker backed by the CPU generator and makes
``torch.cuda.current_device()`` answer "cpu". It refuses to run when CUDA is available, so on a GPU
the trainer executes stock Megatron code. Everything else (the causal mask, initialisation) the
trainer handles by passing explicit inputs and config, not by patching.
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core.tensor_parallel import random as mp_random

_APPLIED = False


class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
    """Megatron's RNG tracker with CPU generator states in place of CUDA ones."""

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        gen = torch.Generator()
        gen.manual_seed(seed)
        self.states_[name] = gen.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise ValueError(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def _cpu_current_device() -> str:
    return "cpu"


def apply_cpu_shim() -> None:
    """Install the CPU tracker and ``current_device`` stand-in (idempotent; CPU-only)."""
    global _APPLIED
    if torch.cuda.is_available():
        raise RuntimeError("the Megatron CPU shim must not be applied when CUDA is available")
    if _APPLIED:
        return
    mp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.cuda.current_device = _cpu_current_device
    _APPLIED = True


def seed_cpu_rng_tracker(seed: int) -> None:
    """CPU counterpart of ``model_parallel_cuda_manual_seed`` (the same seed offsets per tp rank)."""
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank() if parallel_state.model_parallel_is_initialized() else 0
    tracker = mp_random.get_cuda_rng_tracker()
    tracker.reset()
    torch.manual_seed(seed)
    tracker.add(mp_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mp_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024)  # no expert parallelism
