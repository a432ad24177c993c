"""The training engine: what touches MXNet's executors on every batch.

bucketing.py: the bucketing module (one executor per bucket, shared parameters and memory,
fit/score/predict on the configured devices); loop.py: the epoch loop (fit, evaluation, score)
with its positions for exact resume; prefetch.py: data prefetching on a thread;
monitoring.py: the profiler and weight/gradient statistics; allocator.py: making freed
executor memory leave the process (for ``bucket_memory``).
"""
