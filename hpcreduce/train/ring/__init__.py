"""Ring AllReduce training: the trainer's three phases, its state, and its elastic driver."""
