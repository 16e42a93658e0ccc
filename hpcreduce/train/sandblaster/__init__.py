"""Sandblaster training (``--mode sandblaster``): a model's batch objective minimised by
``hpcreduce.sandblaster`` (L-BFGS or gradient descent over sharded vectors, work units with
load balancing and backup tasks). ``trainer``: the entry point; ``flat``: parameters as one
vector; ``units``: a worker's compute of one unit."""
