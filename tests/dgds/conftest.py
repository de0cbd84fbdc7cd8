"""Real parts for the DGDS-in-vLLM tests: a draft server on 127.0.0.1 and one vLLM instance whose
speculative decoding is the DGDS proposer (start-up costs a minute or two, so one per module)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from seer.dgds.vllm import speculative_config


@dataclass
class DgdsVllm:
    pool: object  # seer.fleet.pool.InstancePool with one instance
    dgds: object  # seer.dgds.server.grpc_server.DgdsServer
    prompts: list  # PromptSpec of the running-sum task
    log_path: Path
    token: str  # the server's secret, which the instance got in its environment (SEER_DGDS_TOKEN)

    @property
    def client(self):
        return self.pool.clients[0]


@pytest.fixture(scope="module")
def dgds_vllm(tiny_model, tmp_path_factory) -> DgdsVllm:
    """The DGDS proposer inside a real vLLM CPU instance, fed by a real DGDS server.

    Draft lengths are fixed (SEER_DGDS_ADAPTIVE=0) so that acceptance comparisons between drafting
    modes measure the drafts, not the policy's choice of when to draft. The server requires a
    secret, handed to the proposer in the environment as a run does.
    """
    import secrets

    from transformers import AutoTokenizer

    from seer.dgds.server.grpc_server import DgdsServer
    from seer.fleet.instance import InstanceSpec
    from seer.procs import free_port
    from seer.fleet.pool import InstancePool
    from seer.tasks import TaskConfig, encode_prompts, load_task

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    prompts = encode_prompts(load_task(TaskConfig(num_prompts=6, seed=3)).records, tok, 1024)
    token = secrets.token_urlsafe(32)
    dgds = DgdsServer("127.0.0.1", 0, token=token).start()
    spec = InstanceSpec(
        "dgds-vllm", str(tiny_model), free_port(), cpus="0", max_model_len=1024,
        kv_cache_bytes=96 * 2**20, max_num_seqs=64,
        extra_args=("--speculative-config", speculative_config(6)),
        env={"SEER_DGDS_ADDRESS": dgds.address, "SEER_DGDS_ADAPTIVE": "0", "SEER_DGDS_UPDATE_TOKENS": "4",
             "SEER_DGDS_TOKEN": token},
    )
    logs = tmp_path_factory.mktemp("dgds-vllm-logs")
    try:
        pool = InstancePool.launch([spec], logs, ready_timeout_s=600)
    except BaseException:
        dgds.stop(0)
        raise
    try:
        yield DgdsVllm(pool, dgds, prompts, logs / "dgds-vllm.log", token)
    finally:
        pool.close()
        dgds.stop(0)
