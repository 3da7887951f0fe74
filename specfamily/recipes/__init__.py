"""How the zoo's models were made: the corpus and its tokenizer, self-distillation, the draft model's training, the
cards' measurements and the published-format exports; ``specfamily-zoo`` (``cli``) runs them. The catalogue that
serves the results is ``specfamily.zoo``."""
