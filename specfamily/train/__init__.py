"""Training support every trainer shares: the one loop (``loop``: schedule, cadence, checkpoint and resume, DDP,
selection), the trainers' configs (``config``: ``configs/train/<name>.yaml`` + ``key=value``), DDP (``ddp``,
``distributed``), device and precision (``precision``), the learning-rate schedule (``schedule``) and the data
streams trainers read (``tokens``, ``distilled``)."""
