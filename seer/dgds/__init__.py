"""DGDS: Seer's Distributed Grouped Draft Server (grouped speculative decoding).

Sub-packages, by concern (``tree`` and ``policy`` stand alone; ``server`` and ``client`` draft with
``tree``; ``vllm`` uses the client, the policy and, for an embedded server, the server; records they
share are in ``seer.dgds.types``):

* ``seer.dgds.tree``: one compressed suffix tree per GRPO group (``suffix_tree``, its compiled
  core ``_suffix_core.c``) and SuffixDecoding-style drafting from it (``drafting``).
* ``seer.dgds.policy``: the marginal-benefit-aware draft-length policy, Algorithm 1
  (``draft_length``), and its online inputs inside an engine (``adaptive``).
* ``seer.dgds.server``: the server state and gRPC service (``group_store``, ``grpc_server``,
  ``metrics``, ``lane``, ``cli``), the run config section (``config``, import-light) and the
  launcher a run uses (``service``).
* ``seer.dgds.client``: the draft client inside each instance (``draft_client``) with its local
  replicas (``replica``) and its end of the sync lane (``lane``); it imports no server module.
* ``seer.dgds.proto`` (generated from ``protos/dgds.proto``, the API) and ``seer.dgds.wire`` (packed
  arrays, lane framing, call metadata): what the server and the client share.
* ``seer.dgds.vllm``: the ``custom_class`` proposer inside vLLM (``proposer``), its settings
  (``settings``), optional worker classes (``worker``), vLLM's spec-decode counters
  (``metrics``), and the ``--speculative-config`` that enables the proposer (in the package).

Nothing is imported here eagerly: ``import seer.config`` reaches ``seer.dgds.server.config``
through this package and must not load grpc or the compiled tree.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Draft": "seer.dgds.types",
    "DraftParams": "seer.dgds.types",
    "DraftPath": "seer.dgds.types",
    "Segment": "seer.dgds.types",
    "SpeculateRow": "seer.dgds.types",
    "SuffixTree": "seer.dgds.tree.suffix_tree",
    "DraftClient": "seer.dgds.client.draft_client",
    "DgdsServer": "seer.dgds.server.grpc_server",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seer.dgds' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
