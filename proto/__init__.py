"""Wire contracts. `from proto import k25_pb2` gives the generated messages."""
