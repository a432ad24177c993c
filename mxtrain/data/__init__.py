"""Data iterators: one file per iterator, its options beside it, and the pieces they share.

bucket_sentence.py (+ _options): text lines for language models, bucketed by length;
tagged.py (+ _options), conll.py, label_vocab.py: token/label sentences for taggers;
arrays.py (+ array_options.py): the ``ndarray`` and ``csv`` row iterators for classifiers and
regressors; libsvm.py and image_record.py (+ sparse_image_options.py): sparse rows and
RecordIO images. Shared: base.py (what iterators report: DataInfo, DataContext),
source_options.py (the options base, field helpers and checks every iterator's options use),
batching.py (bucket choice and cutting buckets into batches), text_files.py (reading a data
file with clear errors), vocab.py (the token vocabulary).
parallel_text.py (+ _options, pair_buckets.py): (source, target) line pairs in 2-D buckets.
"""
