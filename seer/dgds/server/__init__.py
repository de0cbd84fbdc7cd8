"""The draft server and its client: state (``group_store``), gRPC service (``grpc_server``, ``proto``,
``metrics``), ``seer-dgds`` (``cli``), the client with its local replicas (``client``, ``replica``),
the run config section (``config``) and the run's launcher (``service``).

Kept empty: ``seer.dgds.server.config`` is imported by ``seer.config`` and must not load grpc.
"""
