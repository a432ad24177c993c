"""The training engine: what touches MXNet's executors on every batch. It imports no models;
checkpoints and parameter files are written by mxtrain.run from what the module hands over.

bucketing.py: the bucketing module, a coordinator over bucket_pool.py (executors per bucket, shared
memory, the ``bucket_memory`` bound), parameters.py (the parameter store), optimizer_setup.py and
optimizer_state.py (optimizer, kvstore, updater; their state as arrays plus JSON), step.py
(forward/backward/update of one batch) and carried_states.py (recurrent state across batches);
shapes.py: bucket keys and batch splits; the module hands a checkpoint writer an
mxtrain.run.checkpoint_state.ModuleCheckpoint. loop.py: the epoch loop (fit, evaluation, score)
with its positions for exact resume; prefetch.py: data prefetching on a thread; monitoring.py: the
profiler and weight/gradient statistics; allocator.py: making freed executor memory leave the
process (for ``bucket_memory``); kernels.py: timing the operator formulations it is handed.
"""
