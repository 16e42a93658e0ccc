"""Parameter-server training: the worker loop over ``hpcreduce.ps``, the trainer, and its
elastic driver (recovery, growth, checkpoints of shards, fault injection)."""
