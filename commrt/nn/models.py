"""Two small networks built from the layers: a LeNet-style CNN and a ResNet."""
import numpy as np

from commrt.nn import functions as F
from commrt.kernels.im2col_numpy import conv_output_size
from commrt.nn.layers import (
    BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, Module, ReLU, ResidualBlock, Sequential,
)


class LeNet(Module):
    """conv-relu-pool, conv-relu-pool, then three fully connected layers.

    The defaults are LeNet-5 for 28x28 images (5x5 kernels, the first one
    padded); ``image_size``, ``channels``, ``kernel_size`` and ``padding``
    adapt it to other images, e.g. ``LeNet(image_size=8, kernel_size=3,
    padding=(1, 1))`` for the 8x8 digits.
    """

    def __init__(self, in_channels=1, num_classes=10, image_size=28, channels=(6, 16),
                 kernel_size=5, padding=(2, 0), hidden=(120, 84), dtype=np.float32):
        super().__init__()
        c1, c2 = channels
        size = image_size
        for p in padding:                         # each stage: conv then 2x2 pool
            size = conv_output_size(size, kernel_size, 1, p, 1) // 2
        if size < 1:
            raise ValueError(f"LeNet: a {image_size}x{image_size} image is too small for "
                             f"{kernel_size}x{kernel_size} kernels with padding {padding}")
        self.features = Sequential(
            Conv2d(in_channels, c1, kernel_size, padding=padding[0], dtype=dtype), ReLU(),
            MaxPool2d(2),
            Conv2d(c1, c2, kernel_size, padding=padding[1], dtype=dtype), ReLU(), MaxPool2d(2),
            Flatten())
        widths = (c2 * size * size,) + tuple(hidden)
        layers = []
        for a, b in zip(widths, widths[1:]):
            layers += [Linear(a, b, dtype=dtype), ReLU()]
        self.classifier = Sequential(*layers, Linear(widths[-1], num_classes, dtype=dtype))

    def forward(self, x):
        return self.classifier(self.features(x))


class ResNet(Module):
    """A small ResNet: a 3x3 stem, stages of residual blocks (width doubling and
    resolution halving from stage to stage), global average pooling, a linear head."""

    def __init__(self, in_channels=3, num_classes=10, width=16, blocks=(1, 1, 1), dtype=np.float32):
        super().__init__()
        self.stem = Sequential(Conv2d(in_channels, width, 3, padding=1, bias=False, dtype=dtype),
                               BatchNorm2d(width, dtype=dtype), ReLU())
        stages, c = [], width
        for i, n in enumerate(blocks):
            out = width * 2 ** i
            for j in range(n):
                stages.append(ResidualBlock(c, out, stride=2 if (i > 0 and j == 0) else 1,
                                            dtype=dtype))
                c = out
        self.stages = Sequential(*stages)
        self.head = Linear(c, num_classes, dtype=dtype)

    def forward(self, x):
        h = self.stages(self.stem(x))
        return self.head(F.mean(h, axis=(2, 3)))
