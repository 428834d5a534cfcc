"""InTune's cache (`IntuneOptions(cache=True)`) on an image pipeline under
`model.fit`: JPEG files read and decoded, then randomly cropped and flipped.

`from_tensor_slices(paths)` -> `map(read_file, decode_jpeg)` (`decode`) ->
`map(random_crop, random_flip_left_right, convert_image_dtype)` (`augment`:
stateful, unseeded random ops) -> `batch` -> `prefetch`. The deepest point
that repeats each epoch is the decode: InTune must cache there and never after
the random ops (the script checks where it cached, and that the augmented
epochs still differ). A small CNN trains 3 epochs, one `fit` per variant and
repeat, interleaved (`cache.run`), each on new dataset objects:

- `autotune`: the pipeline as written, TF's AUTOTUNE;
- `intune`: `intune_tf.tune(..., cache=False)`;
- `intune cache`: `intune_tf.tune(..., cache=True)`;
- `hand .cache()`: AUTOTUNE with a `.cache()` right after the decode.

Then a one-epoch job, interleaved: `intune` against `intune cache`.

Run: `python benchmarks/cache_image.py [--images 2000] [--repeats 5]`.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from cache import one_epoch_report
from cache import paired
from cache import run
from cache import table
import keras
import numpy as np
import tensorflow as tf

import intune_tf
from intune_tf import arguments
from intune_tf import host
from intune_tf.bench import workloads

AUTOTUNE = tf.data.AUTOTUNE


def _write_jpegs(count: int, size: int, folder: str) -> tuple[list[str],
                                                              list[int]]:
  jpegs, labels = workloads.jpeg_images(count=count, size=size)
  paths = []
  for i, jpeg in enumerate(jpegs):
    paths.append(os.path.join(folder, f"{i:06d}.jpg"))
    with open(paths[-1], "wb") as f:
      f.write(jpeg)
  return paths, list(labels)


def _decode(path, label):
  return tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label


def _augment(crop: int):
  def augment(image, label):
    image = tf.image.random_crop(image, [crop, crop, 3])
    image = tf.image.random_flip_left_right(image)
    return tf.image.convert_image_dtype(image, tf.float32), label
  return augment


def pipeline(paths, labels, crop: int, batch_size: int,
             hand_cache: bool = False) -> tf.data.Dataset:
  """The image pipeline, one epoch per iterator; with `hand_cache`, a
  `.cache()` right after the decode."""
  ds = tf.data.Dataset.from_tensor_slices(
      (tf.constant(paths), tf.constant(labels, tf.int64)))
  ds = ds.map(_decode, num_parallel_calls=AUTOTUNE)
  if hand_cache:
    ds = ds.cache()
  ds = ds.map(_augment(crop), num_parallel_calls=AUTOTUNE)
  return ds.batch(batch_size).prefetch(AUTOTUNE)


def _model(crop: int) -> keras.Model:
  model = keras.Sequential([
      keras.Input((crop, crop, 3)),
      keras.layers.Conv2D(8, 5, strides=4, activation="relu"),
      keras.layers.GlobalAveragePooling2D(),
      keras.layers.Dense(workloads.NUM_CLASSES)])
  model.compile(optimizer="adam",
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def _check_placement(paths, labels, crop: int, batch_size: int) -> str:
  """Where InTune caches this pipeline, after 2 epochs of it; raises if that
  is not the decode or if the cached epochs repeat their augmentation."""
  ds = intune_tf.tune(pipeline(paths, labels, crop, batch_size), cache=True)
  epochs = []
  for _ in range(2):
    it = iter(ds)
    session = intune_tf.session_of(it)
    epochs.append(np.concatenate([x.numpy() for x, _ in it]))
    where = session.cache()
  if where["served"] < 0.99:
    raise SystemExit(f"the second epoch was not served from the cache: "
                     f"{where}")
  if np.array_equal(epochs[0], epochs[1]):
    raise SystemExit("two epochs gave the same crops: the cache is after the "
                     f"random ops ({where['point']})")
  return where["point"]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=arguments.positive_int, default=2000,
                      help="JPEG files (default 2,000).")
  parser.add_argument("--size", type=arguments.positive_int, default=320,
                      help="Their height and width (default 320).")
  parser.add_argument("--crop", type=arguments.positive_int, default=224,
                      help="The random crop's height and width (default 224).")
  parser.add_argument("--batch-size", type=arguments.positive_int, default=64)
  parser.add_argument("--repeats", type=arguments.positive_int, default=5,
                      help="Interleaved repeats (default 5).")
  parser.add_argument("--epochs", type=arguments.positive_int, default=3,
                      help="Epochs per fit (default 3).")
  args = parser.parse_args(argv)
  os.environ["INTUNE_WARMSTART_DIR"] = tempfile.mkdtemp(prefix="intune-ws-")
  folder = tempfile.mkdtemp(prefix="intune-images-")
  paths, labels = _write_jpegs(args.images, args.size, folder)
  decoded_mb = args.images * args.size * args.size * 3 / 1e6
  print(f"{args.images:,} JPEG files of {args.size}x{args.size} "
        f"({sum(os.path.getsize(p) for p in paths) / 1e6:.0f} MB; "
        f"{decoded_mb:.0f} MB decoded), crop {args.crop}, batch "
        f"{args.batch_size}, {args.repeats} interleaved repeats, "
        f"{host.usable_cpus()} CPUs, TF {tf.__version__}", flush=True)
  point = _check_placement(paths, labels, args.crop, args.batch_size)
  print(f"InTune caches after {point}; the augmented epochs differ",
        flush=True)

  def make(name):
    ds = pipeline(paths, labels, args.crop, args.batch_size,
                  hand_cache=name == "hand .cache()")
    if name.startswith("intune"):
      ds = intune_tf.tune(ds, cache=name == "intune cache")
    return ds

  model = _model(args.crop)
  # Build and trace the model (a full and the last, short batch's shape)
  # once, outside the measured fits.
  model.fit(make("autotune"), epochs=1, verbose=0)
  names = ["autotune", "intune", "intune cache", "hand .cache()"]
  results = run(model, names, make, args.epochs, args.repeats)
  print(f"\nimage pipeline under model.fit, {args.epochs} epochs:\n")
  table(results, "autotune", args.epochs)
  hand = paired(results, "intune cache", "hand .cache()")
  print(f"\nintune cache / hand .cache() time ratio (median of paired): "
        f"{1 / hand[0]:.3f}")
  one_epoch_report(run(model, ["intune", "intune cache"], make, 1,
                       args.repeats))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
