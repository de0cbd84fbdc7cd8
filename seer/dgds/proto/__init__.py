"""Generated gRPC code for protos/dgds.proto (regenerate: python -m seer.dgds.proto.generate)."""
