"""Training: setting a run up (setup.py), a new run (new_run.py), a resumed one (resume.py),
the training itself (supervise.py) and the run's hooks (run_hooks.py, callbacks.py).

Nothing here imports inference; MXNet loads only after a run's thread settings are applied.
"""
