"""Predicted training throughput of the non-transformer families against published measurements.

    python bench/families_published.py

Each row: the measurement's stated settings (GPU, precision, batch, optimizer, one GPU, eager)
pinned in the simulator, predicted images/s against the published images/s. Sources:

* timm ``results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv`` (huggingface/pytorch-image-models;
  ``benchmark.py --bench train --amp``: RTX 3090, AMP fp16, channels-first, PyTorch 1.12, SGD,
  the listed batch per row, ImageNet-1k heads);
* InceptionNeXt README (sail-sg/inceptionnext; timm 0.6.11 ``benchmark.py``): A100, "full
  precision" (PyTorch 1.13 defaults: fp32 matmuls, TF32 cuDNN convolutions), batch 128.
"""

from __future__ import annotations

from simulator.api import simulate
from simulator.families import spec_from_dict
from simulator.models import get_model

CONVNEXT = {"tiny": ([3, 3, 9, 3], [96, 192, 384, 768]), "small": ([3, 3, 27, 3], [96, 192, 384, 768]),
            "base": ([3, 3, 27, 3], [128, 256, 512, 1024]), "large": ([3, 3, 27, 3], [192, 384, 768, 1536]),
            "xlarge": ([3, 3, 27, 3], [256, 512, 1024, 2048])}
#: (model, GPU, precision, batch, measured images/s, source)
ROWS = [
    ("convnext-tiny", "rtx3090", "fp16", 256, 813.16, "timm rtx3090 amp"),
    ("convnext-small", "rtx3090", "fp16", 192, 489.81, "timm rtx3090 amp"),
    ("convnext-base", "rtx3090", "fp16", 128, 336.98, "timm rtx3090 amp"),
    ("convnext-large", "rtx3090", "fp16", 96, 187.01, "timm rtx3090 amp"),
    ("convnext-xlarge", "rtx3090", "fp16", 64, 115.91, "timm rtx3090 amp"),
    ("vit-l-16", "rtx3090", "fp16", 64, 117.08, "timm rtx3090 amp (transformer reference)"),
    ("convnext-tiny", "a100-40gb-sxm", "fp32", 128, 575.0, "InceptionNeXt README, A100 full precision"),
]


def _model(name: str):
    if name.startswith("convnext-"):
        d, w = CONVNEXT[name.split("-", 1)[1]]
        return spec_from_dict(dict(name=name, family="convnext", depths=d, widths=w, num_classes=1000))
    return get_model(name)


def main() -> None:
    print("| model | GPU | precision | batch | published img/s | predicted img/s | error | source |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for name, gpu, prec, batch, measured, src in ROWS:
        spec = _model(name)
        kw = dict(precision=prec, compile=False, micro_batch=batch, global_batch=batch, steps=1, optimizer="sgd",
                  sharding="ddp", checkpointing="none", offload="none")
        if spec.family == "vit":
            kw["attention"] = "eager"
        p = simulate(spec, f"1x{gpu}", **kw)
        per_sample = p.recipe["seq_len"]  # ViT: tokens per image; ConvNeXt: 1
        pred = p.tokens_per_s / per_sample
        print(f"| {name} | {gpu} | {prec} | {batch} | {measured:,.0f} | {pred:,.0f} | {pred / measured - 1:+.0%} | {src} |")


if __name__ == "__main__":
    main()
