"""The draft client, which runs inside every inference instance (the DGDS proposer in vLLM):
``draft_client`` (DraftClient), the local replicas of groups' trees it drafts from (``replica``) and
its end of the server's sync lane (``lane``).

It imports none of ``seer.dgds.server`` (tests/test_layers.py checks it): what it shares with the
server is the API (``seer.dgds.proto``), ``seer.dgds.wire`` (packed arrays, the lane's framing,
call metadata) and the trees and records below both (``seer.dgds.tree``, ``seer.dgds.types``).
Nothing is imported here eagerly.
"""
