"""Train the LeNet-style CNN on scikit-learn's 8x8 handwritten digits.

    python examples/train_digits.py [--epochs 30] [--batch-size 32] [--lr 0.05]

Prints a progress bar per epoch and one summary line: test accuracy, loss,
images per second.  The pieces (``build_model``, ``load_data``,
``train_epoch``, ``evaluate``) are importable so that a data-parallel script
can reuse them with its own sampler and optimizer wrapper.
"""
import argparse
import sys
import time

import numpy as np

from commrt import nn, optim
from commrt.data import DataLoader, load_digits
from commrt.nn import functions as F


def build_model(seed=0):
    """LeNet adapted to 8x8 images: padded 3x3 convolutions, 2x2 pooling."""
    nn.manual_seed(seed)
    return nn.LeNet(in_channels=1, num_classes=10, image_size=8, channels=(32, 64),
                    kernel_size=3, padding=(1, 1), hidden=(128, 64))


def load_data(batch_size=32, seed=0, sampler=None):
    """(train_loader, test_loader) over a fixed stratified 80/20 split."""
    train, test = load_digits("train", seed=seed), load_digits("test", seed=seed)
    train_loader = DataLoader(train, batch_size, shuffle=sampler is None, seed=seed,
                              sampler=sampler)
    return train_loader, DataLoader(test, 256)


def augment(images, rng, shift=1):
    """Translate each image by up to ``shift`` pixels (zero fill): the 1438
    training digits are few, and small shifts are the variation they lack."""
    n, _, h, w = images.shape
    padded = np.pad(images, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
    dy, dx = rng.integers(0, 2 * shift + 1, size=(2, n))
    rows = (dy[:, None] + np.arange(h))[:, None, :, None]
    cols = (dx[:, None] + np.arange(w))[:, None, None, :]
    return padded[np.arange(n)[:, None, None, None], np.arange(images.shape[1])[:, None, None],
                  rows, cols]


def train_epoch(model, loader, optimizer, progress=None, rng=None):
    """One pass over ``loader`` (augmented when ``rng`` is given); returns
    (mean loss, images seen)."""
    model.train()
    total, seen = 0.0, 0
    for images, labels in loader:
        if rng is not None:
            images = augment(images, rng)
        loss = F.cross_entropy(model(nn.Tensor(images)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
        seen += len(labels)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{total / seen:.4f}", refresh=False)
    return total / max(seen, 1), seen


@nn.no_grad()
def evaluate(model, loader):
    """(mean loss, accuracy) of ``model`` over ``loader``."""
    model.eval()
    total, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        logits = model(nn.Tensor(images))
        total += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.data.argmax(axis=1) == labels).sum())
        seen += len(labels)
    return total / seen, correct / seen


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return p.parse_args(argv)


def main(argv=None):
    from tqdm import tqdm

    args = parse_args(argv)
    nn.backend.keep_freed_memory()          # reuse activation memory step after step
    model = build_model(args.seed)
    train_loader, test_loader = load_data(args.batch_size, args.seed)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    schedule = optim.CosineAnnealingLR(optimizer, T_max=args.epochs)
    rng = np.random.default_rng(args.seed)
    images, train_time = 0, 0.0
    with tqdm(total=args.epochs * len(train_loader), desc="training", unit="batch",
              disable=args.no_progress, file=sys.stderr) as bar:
        for epoch in range(args.epochs):
            train_loader.set_epoch(epoch)
            bar.set_description(f"epoch {epoch + 1}/{args.epochs}")
            start = time.perf_counter()
            train_loss, seen = train_epoch(model, train_loader, optimizer, bar, rng)
            train_time += time.perf_counter() - start
            images += seen
            schedule.step()
    test_loss, accuracy = evaluate(model, test_loader)
    print(f"test accuracy {accuracy:.2%}  test loss {test_loss:.4f}  train loss {train_loss:.4f}  "
          f"{images / train_time:.0f} images/s  ({args.epochs} epochs, {train_time:.1f} s)")
    return accuracy


if __name__ == "__main__":
    main()
