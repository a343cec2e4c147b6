"""Write a synthetic ImageFolder (class folders of JPEGs) for data-pipeline benchmarks on a machine with no data set.

Smooth colour fields with noise, so that decoding costs what a photo of the same size costs.
Usage: python benchmarks/make_imagefolder.py OUT [--classes 16] [--per-class 100] [--size 256]"""

import argparse
import os

import numpy as np
from PIL import Image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--size", type=int, default=256)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:a.size, 0:a.size] / a.size
    for c in range(a.classes):
        folder = os.path.join(a.out, f"class{c:03d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(a.per_class):
            base = np.stack([np.sin(xx * rng.uniform(1, 9) + yy * rng.uniform(1, 9) + k) for k in range(3)], -1)
            img = (base * 90 + 128 + rng.normal(0, 18, base.shape)).clip(0, 255).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)
    print(f"{a.classes * a.per_class} images in {a.classes} classes at {a.out}")


if __name__ == "__main__":
    main()
