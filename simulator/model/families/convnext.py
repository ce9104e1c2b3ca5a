"""ConvNeXt (Liu et al. 2022; Hugging Face ``ConvNextForImageClassification``) as operations.

A 4x4 stride-4 patchify stem (a convolution, executed as an implicit GEMM) and a channels-first
LayerNorm; four stages of ``depths`` blocks at ``widths`` channels on a 56, 28, 14, 7 grid (for a
224 image), each stage after the first opened by a LayerNorm and a 2x2 stride-2 convolution
(an implicit GEMM). A block: 7x7 depthwise convolution (bandwidth-bound: 49 multiply-adds per
element read), permute to channels-last (a copy: LayerNorm needs contiguous input), LayerNorm,
pointwise GEMM to 4x width, GELU, pointwise GEMM back, layer scale, permute back and the
residual add. Then global average pooling, a LayerNorm and the classifier.

Memory format: the study ran Hugging Face's module as it is, channels-first (NCHW), so the
permute before each block's LayerNorm is a copy (in :data:`BLOCK_PASSES`) and the permute back a
strided read by the residual add. Channels-last (``torch.channels_last``) would skip that copy,
2-3% of a step by this model; but timm's training benchmarks of the same block on an RTX 3090
(AMP, PyTorch 1.12; huggingface/pytorch-image-models ``results/benchmark-train-amp-{nchw,nhwc}-
pt112-cu113-rtx3090.csv``) measure channels-last within 0.5% of channels-first for ConvNeXt
S/B/L/XL (487.15/338.68/187.93/116.37 against 489.81/336.98/187.01/115.91 images/s, the
depthwise convolution's channels-last kernels presumably giving back what the copy saves). Not a
material difference, so the memory format is not a knob.

A sample is one image (``seq_len`` 1: "tokens" are images). Hugging Face's ConvNeXt does not
support gradient checkpointing and has no attention: checkpointing is not searched, nor is the
attention knob. Parameters count exactly as ``ConvNextForImageClassification`` (tests).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from .. import hf_eager, workload
from ..spec import NamedSpec
from .base import Block, Family, Graph, Knobs, Op

#: Depthwise kernel size and the pointwise expansion of a ConvNeXt block (Liu et al. 2022, fig. 4).
DW_KERNEL, EXPANSION = 7, 4
#: Eager elementwise passes per block and pixel, in units of C elements read or written:
#: channels-last copy 2, LayerNorm 2, GELU 2 x 4, layer scale 2, residual add 3 (17; 5 kernels);
#: compiled (Inductor): LayerNorm with the copy 2, GELU 8, scale + add 3 (13; 3 kernels).
BLOCK_PASSES = {False: (17, 5), True: (13, 3)}
#: Under eager torch.autocast the residual stream is fp32 (the channels-first LayerNorms' and the layer
#: scale's fp32 parameters promote their half inputs): per block and channel element the depthwise
#: convolution's input is cast down (read 4, write 2: 6 bytes, a kernel), the layer scale writes fp32
#: (2 more than the half it was counted as) and the permuted residual add reads and writes fp32 (6 more):
#: 14 bytes forward (Hugging Face ConvNextLayer, timm ConvNeXtBlock: ``gamma * x`` then ``shortcut + x``)
AUTOCAST_STREAM_BYTES, AUTOCAST_STREAM_KERNELS = 14.0, 1
#: channels-first LayerNorm (stem, downsampling): permute copy + LayerNorm + permute: 6 passes, 3 kernels.
CF_NORM_PASSES, CF_NORM_KERNELS = 6, 3


class ConvNextSpec(NamedSpec):
    """A ConvNeXt image classifier. Sizes in elements; ``image_size`` in pixels (square)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: Literal["convnext"]
    depths: tuple[int, ...]
    widths: tuple[int, ...]
    num_classes: int = Field(gt=0)
    image_size: int = Field(default=224, gt=0)
    patch_size: int = Field(default=4, gt=0)
    num_channels: int = Field(default=3, gt=0)
    layer_scale: bool = True
    display: str | None = None
    hf_id: str | None = None
    source: str = ""

    kind: Literal["encoder"] = "encoder"

    @model_validator(mode="after")
    def _check(self) -> ConvNextSpec:
        if len(self.depths) != len(self.widths) or not self.depths:
            raise ValueError(f"depths {list(self.depths)} and widths {list(self.widths)} need one entry per stage")
        if min(self.depths) <= 0 or min(self.widths) <= 0:
            raise ValueError("depths and widths must be positive")
        if (self.image_size // self.patch_size) % 2 ** (len(self.depths) - 1):
            raise ValueError(f"image_size {self.image_size} does not halve evenly over {len(self.depths)} stages")
        return self

    @property
    def n_layers(self) -> int:
        """Blocks in all stages."""
        return sum(self.depths)

    @property
    def seq_len_default(self) -> int:
        """A sample is one image."""
        return 1

    @property
    def fixed_seq_len(self) -> int:
        """Recipes cannot change it: one image per sample."""
        return 1

    @property
    def sample_unit(self) -> str:
        return f"one {self.image_size}×{self.image_size} image"

    @property
    def family_display(self) -> str:
        return "ConvNeXt"

    def grids(self) -> list[int]:
        """Side of each stage's feature map (56, 28, 14, 7 for 224 images)."""
        s = self.image_size // self.patch_size
        return [s // 2**i for i in range(len(self.depths))]

    def block_params(self, c: int) -> int:
        """One block at width c: depthwise conv + bias, LayerNorm, two pointwise layers, layer scale."""
        x = EXPANSION * c
        return (DW_KERNEL**2 * c + c) + 2 * c + (c * x + x) + (x * c + c) + (c if self.layer_scale else 0)

    def param_breakdown(self) -> dict[str, int]:
        w = self.widths
        stem = self.num_channels * self.patch_size**2 * w[0] + w[0] + 2 * w[0]
        down = sum(2 * w[i - 1] + 4 * w[i - 1] * w[i] + w[i] for i in range(1, len(w)))
        blocks = sum(d * self.block_params(c) for d, c in zip(self.depths, w, strict=True))
        return {"stem": stem, "downsampling": down, "blocks": blocks, "final_norm": 2 * w[-1],
                "head": w[-1] * self.num_classes + self.num_classes}

    def n_params(self) -> int:
        """Exact parameter count of ``ConvNextForImageClassification``."""
        return sum(self.param_breakdown().values())

    def n_embedding_params(self) -> int:
        """No lookup tables."""
        return 0

    def describe(self) -> str:
        return (f"{self.display_name} · {self.n_params() / 1e6:.0f} M parameters · stages "
                f"{'/'.join(map(str, self.depths))} × widths {'/'.join(map(str, self.widths))} · ConvNeXt")


def graph(spec: ConvNextSpec, mb: np.ndarray, seq_len: int, knobs: Knobs) -> Graph:
    """One micro-batch of ``mb`` images (``seq_len`` is 1)."""
    e = workload.act_bytes(knobs.precision)
    imgs = np.asarray(mb, float)
    passes, kern = BLOCK_PASSES[knobs.compiled]
    # the block's LayerNorm (nn.LayerNorm, channels-last) writes fp32 under eager autocast
    # where the stack leaves norms to autocast, and pwconv1 casts it back to half
    fp32_norm = knobs.stack.fp32_norm(e, knobs.compiled)
    norm_extra, norm_kern = (workload.FP32_NORM_EXTRA_BYTES + AUTOCAST_STREAM_BYTES, 1 + AUTOCAST_STREAM_KERNELS) \
        if fp32_norm else (0.0, 0)
    # bytes per element a LayerNorm saves of its input: autocast runs layer_norm in fp32 and keeps
    # the fp32 input (the block's: a copy of the depthwise convolution's half output; the stem's
    # and downsampling's: the fp32 stream or the stem convolution's output cast up)
    norm_in = hf_eager.STREAM if fp32_norm else e
    blocks = []
    for i, (depth, c, side) in enumerate(zip(spec.depths, spec.widths, spec.grids(), strict=True)):
        P = imgs * side * side  # pixels of the micro-batch at this stage
        if i > 0:
            cin, pin = spec.widths[i - 1], imgs * (2 * side) ** 2
            down = (
                Op("downsample_norm", "elementwise", bytes_fwd=pin * cin * e * CF_NORM_PASSES,
                   bytes_bwd=pin * cin * e * 2 * CF_NORM_PASSES, kernels_fwd=CF_NORM_KERNELS,
                   kernels_bwd=2 * CF_NORM_KERNELS, saved=pin * cin * norm_in, params=2 * cin),
                Op("downsample_conv", "gemm", m=P, n=c, k=4 * cin, kernels_fwd=1, kernels_bwd=2,
                   saved=pin * cin * e, params=4 * cin * c + c),
            )
            blocks.append(Block(f"downsample{i}", down, 1, pin * cin * e))
        x = EXPANSION * c
        ops = (
            Op("dwconv7x7", "conv", flops_fwd=P * 2 * DW_KERNEL**2 * c, flops_bwd=P * 4 * DW_KERNEL**2 * c,
               bytes_fwd=P * 2 * c * e, bytes_bwd=P * 4 * c * e, kernels_fwd=1, kernels_bwd=2,
               saved=P * c * e, params=DW_KERNEL**2 * c + c),
            Op("pwconv1", "gemm", m=P, n=x, k=c, kernels_fwd=1, kernels_bwd=2, saved=P * c * e, params=c * x + x),
            Op("pwconv2", "gemm", m=P, n=c, k=x, kernels_fwd=1, kernels_bwd=2, saved=P * x * e, params=x * c + c),
            # copy, LayerNorm (input saved), GELU (input saved), layer scale (input saved), residual
            Op("norm_gelu_scale_residual", "elementwise", bytes_fwd=P * c * (passes * e + norm_extra),
               bytes_bwd=2 * P * c * (passes * e + norm_extra), kernels_fwd=kern + norm_kern,
               kernels_bwd=2 * (kern + norm_kern),
               saved=P * (c * norm_in + (x + c) * e), params=2 * c + (c if spec.layer_scale else 0)),
        )
        blocks.append(Block(f"stage{i}", ops, depth, P * c * e))

    side0, c0 = spec.grids()[0], spec.widths[0]
    P0 = imgs * side0 * side0
    pix = imgs * spec.image_size**2 * spec.num_channels
    cl, ncls = spec.widths[-1], spec.num_classes
    Pl = imgs * spec.grids()[-1] ** 2
    loss_f, loss_b = workload.cross_entropy_bytes(imgs * ncls, e, knobs.stack.loss_kind(knobs.compiled))
    outside = (
        Op("stem_conv", "gemm", m=P0, n=c0, k=spec.num_channels * spec.patch_size**2, kernels_fwd=1, kernels_bwd=2,
           saved=pix * e, params=spec.num_channels * spec.patch_size**2 * c0 + c0),
        Op("stem_norm", "elementwise", bytes_fwd=P0 * c0 * e * CF_NORM_PASSES,
           bytes_bwd=P0 * c0 * e * 2 * CF_NORM_PASSES, kernels_fwd=CF_NORM_KERNELS, kernels_bwd=2 * CF_NORM_KERNELS,
           saved=P0 * c0 * norm_in, params=2 * c0),
        Op("pool_norm", "elementwise", bytes_fwd=Pl * cl * e + imgs * cl * 4 * e, bytes_bwd=Pl * cl * e * 2,
           kernels_fwd=2, kernels_bwd=3, saved=imgs * cl * e, params=2 * cl),
        Op("classifier", "gemm", m=imgs, n=ncls, k=cl, kernels_fwd=1, kernels_bwd=2, saved=imgs * cl * e,
           params=cl * ncls + ncls),
        Op("loss", "elementwise", bytes_fwd=loss_f.nbytes, bytes_bwd=loss_b.nbytes, kernels_fwd=loss_f.kernels,
           kernels_bwd=loss_b.kernels),
    )
    return Graph(tuple(blocks), outside, imgs * ncls * knobs.stack.loss_bytes_per_logit(e, knobs.compiled))


def from_hf_config(c, name: str) -> dict:
    """Spec fields from a Hugging Face ``ConvNextConfig`` (``model_type`` convnext)."""
    depths, widths = c.data.get("depths"), c.data.get("hidden_sizes")
    for key, v in (("depths", depths), ("hidden_sizes", widths)):
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"field {key!r} must be a list of integers, got {v!r}")
    labels = c.data.get("id2label")
    n = len(labels) if isinstance(labels, dict) and labels else c.int("num_labels", 21841 if "22k" in name else 1000)
    return dict(family="convnext", depths=tuple(depths), widths=tuple(widths), num_classes=n,
                image_size=c.int("image_size", 224), patch_size=c.int("patch_size", 4),
                num_channels=c.int("num_channels", 3),
                layer_scale=float(c.data.get("layer_scale_init_value", 1e-6) or 0) > 0)


def notes(spec: ConvNextSpec, stack: object) -> list[str]:
    return [f"{spec.display_name} is a convolutional network: a sample is one image (tokens/s = images/s); no "
            "attention, so the attention knob does not apply and is not searched; activation checkpointing is "
            "not searched (Hugging Face's ConvNeXt does not support gradient checkpointing)"]


CONVNEXT = Family(name="convnext", spec_cls=ConvNextSpec, families=("convnext",), graph=graph,
                  attentions=("n/a",), checkpointings=("none",), hf_model_types=("convnext",),
                  from_hf_config=from_hf_config, notes=notes, six_n=False)
