"""Learning-rate schedules: each sets ``group['lr']`` from the epoch count
(closed form, so a resumed schedule continues exactly)."""
import math


class LRScheduler:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_epoch = 0
        self._apply()

    def lr_at(self, base_lr, epoch):
        raise NotImplementedError

    def step(self):
        self.last_epoch += 1
        self._apply()

    def _apply(self):
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(base, self.last_epoch)

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state):
        self.last_epoch, self.base_lrs = int(state["last_epoch"]), list(state["base_lrs"])
        self._apply()


class StepLR(LRScheduler):
    """lr = base * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """Linear warm-up over ``warmup`` epochs, then half a cosine from the base
    rate down to ``eta_min`` at ``T_max``, flat afterwards."""

    def __init__(self, optimizer, T_max, eta_min=0.0, warmup=0):
        if T_max < 1 or not 0 <= warmup < T_max:
            raise ValueError(f"CosineAnnealingLR: need T_max >= 1 and 0 <= warmup < T_max, got "
                             f"T_max={T_max}, warmup={warmup}")
        self.T_max, self.eta_min, self.warmup = T_max, eta_min, warmup
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        if epoch < self.warmup:
            return base_lr * (epoch + 1) / self.warmup
        progress = min(epoch - self.warmup, self.T_max - self.warmup) / (self.T_max - self.warmup)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * progress)) / 2
