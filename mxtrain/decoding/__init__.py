"""Decoding shared by training and inference: the search core (:mod:`.search`), step scores
and beam rows on the device (:mod:`.device`), seq2seq step-by-step decoding (:mod:`.seq2seq`)
and the decoding metrics of an eval set (:mod:`.evaluation`). Nothing here imports
``mxtrain.inference`` or a model: fit's evaluations may use all of it."""
