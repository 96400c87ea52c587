"""``shapes``: a procedurally generated captioning dataset, deterministic by seed.

Scenes of one or two coloured shapes on noisy backgrounds, each with five
paraphrased captions naming colour, size, shape and the spatial relation. Small
models learn it in minutes, so it is the test fixture and the fallback data. It
is written as Karpathy-split JSON + JPEGs, so the same reader serves it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from edgecap.cache import cache_root
from edgecap.data.karpathy import read_karpathy
from edgecap.data.records import CaptionDataset
from edgecap.errors import DataError

VERSION = 5  # bump whenever the images or captions change: it names the cache folder
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 215, 40),
           "purple": (150, 60, 190), "orange": (245, 140, 30), "white": (245, 245, 245), "black": (20, 20, 20)}
SHAPES = ("circle", "square", "triangle", "diamond", "star", "cross")
SIZES = {"small": ("small", "little"), "large": ("large", "big")}
RELATIONS = {"left": ("to the left of", "right"), "right": ("to the right of", "left"),
             "above": ("above", "below"), "below": ("below", "above")}
JSON_NAME = "dataset_shapes.json"
_AN = re.compile(r"\ba (?=[aeiou])")  # "a orange circle" -> "an orange circle"


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, centre: tuple[float, float], radius: float,
                colour: tuple[int, int, int]) -> None:
    x, y = centre
    if shape == "circle":
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour)
    elif shape == "square":
        draw.rectangle((x - radius, y - radius, x + radius, y + radius), fill=colour)
    elif shape == "triangle":
        draw.polygon([(x, y - radius), (x - radius, y + radius), (x + radius, y + radius)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(x, y - radius), (x + radius, y), (x, y + radius), (x - radius, y)], fill=colour)
    elif shape == "star":
        angles = np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, radius, radius * 0.45)
        draw.polygon([(x + r * np.cos(a), y - r * np.sin(a)) for a, r in zip(angles, radii, strict=True)], fill=colour)
    else:
        arm = radius * 0.35
        draw.rectangle((x - radius, y - arm, x + radius, y + arm), fill=colour)
        draw.rectangle((x - arm, y - radius, x + arm, y + radius), fill=colour)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """(size, size, 3) uint8 noisy gradient, a tinted mid grey so that no shape colour (nor white or black) can
    blend into it: every named colour stays visible."""
    base = rng.integers(95, 171) + rng.integers(-15, 16, size=3)
    ramp = np.linspace(-25, 25, size)[None, :, None] * rng.choice([-1, 1])
    if rng.random() < 0.5:
        ramp = ramp.transpose(1, 0, 2)
    noise = rng.normal(0, 14, size=(size, size, 3))
    return np.clip(base[None, None, :] + ramp + noise, 0, 255).astype(np.uint8)


def _captions(objects: list[dict], relation: str | None, rng: np.random.Generator) -> list[str]:
    """Five paraphrases that all name what is drawn (no filler shared by every image, so no constant wins)."""

    def name(o: dict, synonym: int = 0) -> str:
        return f"{SIZES[o['size']][synonym]} {o['colour']} {o['shape']}"

    a = objects[0]
    if relation is None:
        captions = [f"a {name(a)}", f"a {name(a, 1)}", f"a {a['colour']} {a['shape']}",
                    f"one {a['colour']} {a['shape']}", f"a single {name(a)}"]
    else:
        b = objects[1]
        phrase, inverse = RELATIONS[relation]
        inverse_phrase = RELATIONS[inverse][0]
        captions = [f"a {name(a)} {phrase} a {name(b)}", f"a {name(b, 1)} {inverse_phrase} a {name(a, 1)}",
                    f"a {a['colour']} {a['shape']} and a {b['colour']} {b['shape']}",
                    f"a {a['colour']} {a['shape']} {phrase} a {b['colour']} {b['shape']}",
                    f"a {b['colour']} {b['shape']} {inverse_phrase} a {a['colour']} {a['shape']}"]
    order = rng.permutation(len(captions))
    return [_AN.sub("an ", captions[i]) for i in order]


def _scene(rng: np.random.Generator, size: int) -> tuple[Image.Image, list[str]]:
    image = Image.fromarray(_background(rng, size))
    draw = ImageDraw.Draw(image)
    count = 1 if rng.random() < 0.3 else 2
    objects = [{"shape": SHAPES[rng.integers(len(SHAPES))], "colour": list(COLOURS)[rng.integers(len(COLOURS))],
                "size": ("small", "large")[rng.integers(2)]} for _ in range(count)]
    if count == 2:
        while objects[1]["shape"] == objects[0]["shape"] and objects[1]["colour"] == objects[0]["colour"]:
            objects[1]["colour"] = list(COLOURS)[rng.integers(len(COLOURS))]
    relation = None if count == 1 else list(RELATIONS)[rng.integers(len(RELATIONS))]
    radius = {"small": size * 0.11, "large": size * 0.19}
    if relation is None:
        centres = [tuple(rng.uniform(size * 0.3, size * 0.7, 2))]
    else:
        along, across = (size * 0.25, size * 0.75), rng.uniform(size * 0.3, size * 0.7)
        first, second = along if relation in ("left", "above") else along[::-1]
        jitter = rng.uniform(-size * 0.04, size * 0.04, 2)
        if relation in ("left", "right"):
            centres = [(first + jitter[0], across), (second + jitter[1], across)]
        else:
            centres = [(across, first + jitter[0]), (across, second + jitter[1])]
    for obj, centre in zip(objects, centres, strict=True):
        _draw_shape(draw, obj["shape"], centre, radius[obj["size"]], COLOURS[obj["colour"]])
    return image, _captions(objects, relation, rng)


def _recorded_params(json_path: Path) -> dict | None:
    """The parameters a finished generation wrote into its JSON, or None if there is none to trust."""
    try:
        return json.loads(json_path.read_text()).get("params")
    except (OSError, ValueError, AttributeError):
        return None


def generate_shapes(out_dir: Path, *, n_train: int = 2000, n_dev: int = 200, n_test: int = 200,
                    image_size: int = 96, seed: int = 0) -> Path:
    """Write JPEGs + ``dataset_shapes.json`` to ``out_dir`` unless already there; returns the JSON path.

    Same parameters, same bytes. The dataset is built in a temporary sibling folder and renamed into
    place, so a killed generation leaves no half dataset and concurrent ones agree on the result.
    """
    if min(n_train, n_dev, n_test) < 0 or image_size < 32:
        raise ValueError(f"shapes needs split sizes >= 0 and image_size >= 32, got n_train={n_train}, "
                         f"n_dev={n_dev}, n_test={n_test}, image_size={image_size}")
    params = {"version": VERSION, "n_train": n_train, "n_dev": n_dev, "n_test": n_test, "image_size": image_size,
              "seed": seed}
    json_path = out_dir / JSON_NAME
    if _recorded_params(json_path) == params:
        return json_path
    if out_dir.exists() and not json_path.is_file() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir}: exists and holds no {JSON_NAME}; give shapes a new or empty folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        (staging / "images").mkdir()
        rng = np.random.Generator(np.random.PCG64(seed))
        entries = []
        splits = ["train"] * n_train + ["val"] * n_dev + ["test"] * n_test
        for index, split in enumerate(splits):
            image, captions = _scene(rng, image_size)
            filename = f"shapes_{index:05d}.jpg"
            image.save(staging / "images" / filename, quality=92)
            entries.append({"filename": filename, "imgid": index, "split": split,
                            "sentences": [{"raw": c, "tokens": c.split()} for c in captions]})
        (staging / JSON_NAME).write_text(json.dumps({"dataset": "shapes", "params": params, "images": entries}))
        if _recorded_params(json_path) != params:  # another process may have finished the same dataset meanwhile
            if out_dir.exists():
                shutil.rmtree(out_dir)
            os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return json_path


def load_shapes(cache_dir: Path | None = None, **params) -> CaptionDataset:
    """Generate (once) into ``cache_dir/<name from the parameters>`` and read the dataset.

    ``params`` are ``generate_shapes``'s keyword arguments; ``cache_dir`` defaults to the ``datasets``
    folder of ``$EDGECAP_CACHE`` (or ``~/.cache/edgecap``).
    """
    bound = inspect.signature(generate_shapes).bind(Path(), **params)
    bound.apply_defaults()
    settings = {k: v for k, v in bound.arguments.items() if k != "out_dir"}
    name = "shapes-v{}-{seed}-{n_train}-{n_dev}-{n_test}-{image_size}".format(VERSION, **settings)
    folder = (cache_dir or cache_root() / "datasets") / name
    dataset = read_karpathy(generate_shapes(folder, **settings))
    return CaptionDataset(name="shapes", source="shapes", splits=dataset.splits)
