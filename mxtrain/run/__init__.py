"""The run folder: its layout, atomic writes, checkpoints, the metrics log and its history.

folder.py: the run folder (file names, run.json, creation and staging, metrics.jsonl);
checkpoint.py: saving, verifying, choosing and loading checkpoints; history.py: reading finished
and running runs back for ``runs``/``show``/``diff``/``plot``; environment.py: the machine and
software facts recorded in run.json; plugin_files.py: copies of plugin code kept with a run.
"""
