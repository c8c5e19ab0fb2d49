"""commrt.optim: optimizers (one ``_step`` hook per variant) and learning-rate schedules."""
from commrt.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, StepLR  # noqa: F401
from commrt.optim.optimizer import SGD, Adam, AdamW, Optimizer  # noqa: F401
