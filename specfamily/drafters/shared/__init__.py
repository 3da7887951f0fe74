"""What several drafter families share: drafting from target features (``feature_drafting``), dynamic draft trees
(``dynamic_tree``) and reduced draft vocabularies (``draft_vocab``). A family never imports another family, only
this."""
