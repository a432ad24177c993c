"""Inference from a run folder: open a checkpoint, score a data set, predict per task, write.

open.py: a run folder and checkpoint choice into a bound module; tags.py and rows.py: the
predictions of taggers and row (classifier/regression) models; output.py: output files.
"""
