"""Built-in models, one file per family; each returns ``sym_gen(bucket_key)`` for the module.

language_models.py: ``lstm_lm`` and ``gru_lm``; taggers.py: ``rnn_tagger``; classifiers.py:
``mlp``, ``lenet`` and ``rnn_classifier``; rnn_common.py: recurrent layers, the LM graph and
the option checks the recurrent models share. Listing or validating a model never imports
MXNet: the graph builders import it inside their functions.
"""
