"""Training support every trainer shares: the one loop (``loop``: schedule, cadence, resume, DDP, selection) and the
trainers' configs (``config``: ``configs/train/<name>.yaml`` + ``key=value``), state and checkpoints (``state``), DDP
(``ddp``, ``distributed``), device and precision (``precision``), the learning-rate schedule (``schedule``) and the
data streams trainers read (``tokens``, ``distilled``)."""
