"""What makes the batches: the scheduler of decodes and gathers, its ring of batch slots, the reader workers and
their pools, the messages between them, the transform probe, fetching chunks and the gather kernels."""
