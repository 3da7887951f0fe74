"""Training support every trainer shares: state and checkpoints (``state``), DDP (``ddp``, ``distributed``), device and
precision (``precision``), the learning-rate schedule (``schedule``) and the data streams trainers read (``tokens``,
``distilled``)."""
