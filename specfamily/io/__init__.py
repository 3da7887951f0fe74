"""Loading and writing: atomic files (``files``), weights named on the hub (``hub``), where models and datasets come
from (``sources``), the identity a trained drafter records of its target (``identity``) and chat prompts (``chat``)."""
