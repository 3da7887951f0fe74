"""What several drafter families share: drafting from target features (``feature_drafting``), dynamic draft trees
(``dynamic_tree``), reduced draft vocabularies (``draft_vocab``) and greedy tau (``greedy_tau``). A family never
imports another family, only this."""
