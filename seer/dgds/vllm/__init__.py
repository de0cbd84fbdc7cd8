"""DGDS inside vLLM: the ``custom_class`` proposer (``proposer``), its settings (``settings``),
optional worker classes (``worker``) and vLLM's spec-decode counters (``metrics``); here, the
``--speculative-config`` that enables the proposer (``PROPOSER``, ``speculative_config``).

Importing this package imports no vLLM (nor grpc): ``proposer`` and ``worker`` load vLLM where
they need it, and the run's launcher (``seer.dgds.server.service``) reads the flag from here.
"""

from __future__ import annotations

import json

PROPOSER = "seer.dgds.vllm.proposer.DgdsProposer"  # the class vLLM's speculative config names
# Optional second flag: the drafts travel with the step's output instead of a per-step RPC
# (seer.dgds.vllm.executor; vLLM's multiprocessing executor otherwise, CPU or one-node GPU).
EXECUTOR = "seer.dgds.vllm.executor.DgdsExecutor"
EXECUTOR_ARGS = ("--distributed-executor-backend", EXECUTOR)


def speculative_config(num_speculative_tokens: int) -> str:
    """The ``--speculative-config`` value that enables the DGDS proposer on a vLLM server."""
    return json.dumps({"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_speculative_tokens})
