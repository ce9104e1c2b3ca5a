"""Predicted training throughput of the non-transformer families against published measurements.

    python bench/families_published.py

Each row: the measurement's stated settings (GPU, precision, batch, optimizer, one GPU, eager)
pinned in the simulator, predicted images/s against the published images/s. Sources:

* timm ``results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv`` (huggingface/pytorch-image-models;
  ``benchmark.py --bench train --amp``: RTX 3090, AMP fp16, channels-first, PyTorch 1.12, SGD,
  the listed batch per row, ImageNet-1k heads);
* InceptionNeXt README (sail-sg/inceptionnext; timm 0.6.11 ``benchmark.py``): A100, "full
  precision" (PyTorch 1.13 defaults: fp32 matmuls, TF32 cuDNN convolutions), batch 128.

Mamba (second table, tokens/s): the only published Mamba-1 training throughput found with a
stated batch, sequence and GPU is github.com/fla-org/flash-linear-attention issue #32 (2024-07,
``benchmarks/benchmark_training_throughput.py --name mamba``: one GPU, the model cast to bf16
(``.to(torch.bfloat16)``) under accelerate's bf16 autocast, torch fused AdamW, no compile, one
optimizer step per batch): the simulator's ``fla`` stack (bf16 weights, gradients and moments,
8 B/param; fla's fused in-place cross-entropy and fused RMSNorm). fla's Mamba is Hugging Face's
``MambaForCausalLM`` ported (maintainer, fla-org/flash-linear-attention#93): in training it runs
mamba-ssm's ``mamba_inner_fn`` when mamba-ssm and causal-conv1d import, else the slow path; the
reporter notes fla first ran without them, but the slow path's fp32 [batch, inner, sequence,
state] tensors (4 GiB per layer at 16k tokens) cannot fit, so these rows are the fused kernels.
Settings the thread does not state are INFERRED and labelled so: the model is the script's
default ``MambaConfig`` (hidden 2048, 48 layers, state 16, expand 2, vocab 32,000, untied: 1.40 B
parameters, read from fla/models/mamba/configuration_mamba.py at a later commit); the fused
RMSNorm and loss are that later commit's config defaults (fuse_norm, fuse_cross_entropy; the
2024-07 modeling file was not read; with Hugging Face's fp32 MambaRMSNorm the A100-40GB rows
could not have fit); "A100" is the A100-SXM4-40GB the reporter's environment lists, "H100" is
taken as the SXM board. Control (third table): fla's Transformer rows of the same thread and GPU
(TransformerConfig defaults: hidden 2048, 24 layers, 32 heads, SwiGLU 5,632 (fla's GatedMLP
rounding, INFERRED), vocab 32,000, untied; FlashAttention). Treat these rows as a plausibility
check, not validation.

What they say (2026-12-01): the control is predicted within -10..+7% on the same H100, so the
card and the dense parts are modelled. Without the scan backward's atomics the Mamba rows were
predicted 1.6-3x too fast (+56..+205%), a gap of about 26-42 us per token (48 layers) that the
scan's arithmetic cannot fill (about 55 instructions per token, inner channel and state forward
and backward: ~9 us per token on an A100 at full issue rate). mamba-ssm's backward kernel issues
two fp32 atomicAdds per (token, inner channel, state) into dB and dC
(csrc/selective_scan/selective_scan_bwd_kernel.cuh), 6.3 M per token here; timed at a fitted
``fp32_atomic_rate`` per GPU group (``python -m calibration.family_fit``: A100 ~200, H100 ~163
G adds/s, bounded least squares as ``calibrate --from-runs``) the rows are within -8..+8%
in-sample, 9.9% MAPE leaving one run out and 12.1% predicting one GPU's rows with the other's rate.
The fitted rates (and these rows' held-out residuals, which widen every Mamba interval) live in
simulator/data/family_validation.json.
"""

from __future__ import annotations

from simulator.answer.api import simulate
from simulator.answer.family_runs import load
from simulator.model.families import spec_from_dict
from simulator.model.presets import get_model

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


#: fla's Mamba rows (settings, model and source): simulator/data/family_validation.json, one definition
#: shared with the intervals of Mamba predictions (``python -m simulator.validation.family_validation``)
FLA = load()["mamba"]
FLA_MAMBA = FLA.model
FLA_SOURCE = "fla-org/flash-linear-attention#32 (settings partly inferred)"
#: (GPU, batch, sequence, measured tokens/s)
MAMBA_ROWS = [(r.gpu, r.batch, r.seq_len, r.measured_tokens_per_s) for r in FLA.runs]

#: fla's default TransformerConfig (INFERRED, see the module docstring)
FLA_TRANSFORMER = dict(name="fla-transformer-1.3b", family="llama", kind="decoder", n_layers=24, hidden=2048,
                       n_heads=32, ffn_hidden=5632, gated_mlp=True, vocab_size=32000, max_positions=32768,
                       tied_embeddings=False, pos_embedding="rotary", norm="rmsnorm", linear_bias=False,
                       norm_bias=False, head="lm", default_seq_len=2048)
#: (GPU, batch, sequence, measured tokens/s) of fla's Transformer, same thread
TRANSFORMER_ROWS = [
    ("h100-sxm", 1, 32768, 12216.43), ("h100-sxm", 2, 16384, 18647.61), ("h100-sxm", 1, 16384, 18242.55),
    ("h100-sxm", 4, 8192, 25004.98), ("h100-sxm", 2, 8192, 24419.43),
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
    for label, spec, rows, extra in ((f"{FLA_MAMBA['name']}", spec_from_dict(FLA_MAMBA), MAMBA_ROWS, {}),
                                     ("control: fla-transformer-1.3b", spec_from_dict(FLA_TRANSFORMER),
                                      TRANSFORMER_ROWS, {"attention": "sdpa"})):
        print(f"\n{label} ({spec.n_params() / 1e9:.2f} B parameters), bf16 model, fused AdamW, one GPU, "
              "eager, stack fla:\n")
        print("| GPU | batch | sequence | published tok/s | predicted tok/s | error | predicted memory | source |")
        print("|---|---:|---:|---:|---:|---:|---|---|")
        for gpu, batch, seq, measured in rows:
            p = simulate(spec, f"1x{gpu}", stack="fla", precision="bf16", compile=False, micro_batch=batch,
                         global_batch=batch, seq_len=seq, steps=1, optimizer="adamw", sharding="ddp",
                         checkpointing="none", offload="none", **extra)
            mem = p.memory_gib
            fit = f"{mem['total']:.0f} of {mem['capacity']:.0f} GiB" + ("" if p.feasible else " (does not fit)")
            print(f"| {gpu} | {batch} | {seq} | {measured:,.0f} | {p.tokens_per_s:,.0f} | "
                  f"{p.tokens_per_s / measured - 1:+.0%} | {fit} | {FLA_SOURCE} |")

if __name__ == "__main__":
    main()
