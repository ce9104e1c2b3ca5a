"""Time and memory of one training step: kernels, compute, memory, communication, parallelism."""
