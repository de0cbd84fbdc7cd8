"""Process-group and RNG setup that Megatron-core needs before a model can be built.

One code path for every world size: world size 1 (the default, a trainer in one process) uses a
file:// rendezvous in a fresh temp dir, so concurrent runs on one machine never race for a TCP
port; a rank of a larger group joins rank 0's TCP store (``tcp://<rank 0's node address>:port``),
which rank 0 binds to that address only (torch's own ``tcp://`` rendezvous listens on every
interface, and its store has no authentication). gloo on CPU, NCCL on GPUs. Megatron's parallel
state then splits the world into tensor-, pipeline- and data-parallel groups (tp and pp
consecutive ranks innermost, as Megatron orders them).
"""

from __future__ import annotations

import os
import socket
import tempfile
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

from seer.trainer.config import RankPlace


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def init_megatron(seed: int = 0, place: RankPlace | None = None) -> None:
    """Initialise torch.distributed, Megatron's parallel state and its RNG tracker for `place`.

    Safe to call more than once per process with the same place: an existing process group and
    parallel state are reused, and the RNG tracker is re-seeded.
    """
    place = place or RankPlace()
    if place.world_size % place.expert_parallel:
        raise ValueError(f"world size {place.world_size} is not a multiple of expert_parallel {place.expert_parallel}")
    if place.world_size % (place.tensor_parallel * place.pipeline_parallel):
        raise ValueError(f"world size {place.world_size} is not a multiple of tensor_parallel "
                         f"{place.tensor_parallel} x pipeline_parallel {place.pipeline_parallel}")
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        from seer.compat.megatron_cpu_shim import apply_cpu_shim

        apply_cpu_shim()
    if not dist.is_initialized():
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        init_method = place.init_method
        if init_method is None:
            if place.world_size != 1:
                raise ValueError("a trainer world larger than 1 needs rank 0's tcp:// address")
            init_method = f"file://{os.path.join(tempfile.mkdtemp(prefix='seer-trainer-pg-'), 'store')}"
        timeout = timedelta(seconds=place.timeout_s)
        rendezvous = dict(store=_tcp_store(init_method, place, timeout)) if init_method.startswith("tcp://") \
            else dict(init_method=init_method)
        dist.init_process_group(backend="nccl" if on_gpu else "gloo", world_size=place.world_size, rank=place.rank,
                                timeout=timeout, **rendezvous)
    if dist.get_world_size() != place.world_size or dist.get_rank() != place.rank:
        raise RuntimeError(f"this process is already rank {dist.get_rank()} of {dist.get_world_size()}, "
                           f"not rank {place.rank} of {place.world_size}")
    if not parallel_state.model_parallel_is_initialized():
        # Experts are never split by tensor parallelism (expert TP 1): whole experts, expert_parallel ways.
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=place.tensor_parallel,
                                                 pipeline_model_parallel_size=place.pipeline_parallel,
                                                 expert_model_parallel_size=place.expert_parallel,
                                                 expert_tensor_parallel_size=1)
    if on_gpu:
        model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    else:
        from seer.compat.megatron_cpu_shim import seed_cpu_rng_tracker

        seed_cpu_rng_tracker(seed)


def _tcp_store(init_method: str, place: RankPlace, timeout: timedelta) -> dist.TCPStore:
    """The group's store at `tcp://host:port`: rank 0 serves it on a socket bound to `host` alone
    (handed to torch as `master_listen_fd`: TCPStore itself binds every interface), the others join it."""
    url = urlsplit(init_method)
    host, port = url.hostname, url.port
    if place.rank != 0:
        return dist.TCPStore(host, port, place.world_size, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(host, port, place.world_size, True, timeout, master_listen_fd=sock.detach())
