"""Parameter-server training: the worker loop over ``hpcreduce.ps``, the trainer, and its
elastic driver (recovery, growth, checkpoints of shards, fault injection) and, without ULFM,
the checkpoint-and-relaunch fallback (``fallback``, ``ledger``)."""
