"""The draft server: state (``group_store``), gRPC service (``grpc_server``, ``metrics``), its sync
lane (``lane``), ``seer-dgds`` (``cli``), the run config section (``config``) and the run's launcher
(``service``). The client is ``seer.dgds.client``; the API ``seer.dgds.proto``; what both share
beyond it ``seer.dgds.wire``.

Kept empty: ``seer.dgds.server.config`` is imported by ``seer.config`` and must not load grpc.
"""
