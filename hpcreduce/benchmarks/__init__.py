"""Benchmarks behind ``hpcreduce bench NAME``; each measures hpcreduce against a peer in the same run."""
