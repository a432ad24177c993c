"""Built-in models, one file per family; each returns ``sym_gen(bucket_key)`` for the module.

language_models.py: ``lstm_lm`` and ``gru_lm``; taggers.py: ``rnn_tagger``; classifiers.py:
``mlp``, ``lenet`` and ``rnn_classifier``; rnn_seq2seq.py and transformer_seq2seq.py:
``rnn_seq2seq`` and ``transformer_seq2seq`` (encoder-decoders, with seq2seq_common.py: their
training, encoder and decoder-step graphs); rnn_common.py: recurrent layers and the LM graph the
recurrent models share. Each family's options live in an ``*_options.py`` beside it
(recurrent_options.py: what the recurrent ones share), which never imports MXNet, so listing or
validating a model does not load it; the graph builders import it at the top.
"""
