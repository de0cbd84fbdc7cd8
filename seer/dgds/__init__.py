"""DGDS: Seer's Distributed Grouped Draft Server.

One compressed suffix tree per GRPO group (``suffix_tree``), SuffixDecoding-style drafting from it
(``drafting``), the server state and gRPC service (``group_store``, ``server``, ``cli``), the draft
client with local replicas (``client``, ``replica``), and the marginal-benefit-aware draft-length
policy (``draft_length``). The API is defined in ``protos/dgds.proto``.
"""

from seer.dgds.types import Draft, DraftParams, DraftPath, Segment, SpeculateRow

__all__ = ["Draft", "DraftParams", "DraftPath", "Segment", "SpeculateRow", "DraftClient", "DgdsServer"]


def __getattr__(name: str):
    # gRPC-heavy modules load on first use, so the tree and policies import cheaply.
    if name == "DraftClient":
        from seer.dgds.client import DraftClient

        return DraftClient
    if name == "DgdsServer":
        from seer.dgds.server import DgdsServer

        return DgdsServer
    raise AttributeError(name)
