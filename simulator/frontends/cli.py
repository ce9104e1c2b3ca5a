"""The `simulate` command: one model on one cluster, plus subcommands.

Exit status: 0 = a feasible plan (or a reader that closed the pipe early, ``| head``), 1 = nothing
fits, 2 = usage error (one line, no traceback), 3 = internal error (simulator.core.errors.run_cli).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..core.errors import run_cli
from ..core.vocab import ROUTINGS
from .args import ArgParser, _positive_float, _positive_int, add_recipe_args, fraction_arg

SUBCOMMANDS = {"compare": "simulator.frontends.compare:main", "budget": "simulator.frontends.budget:main",
               "study-grid": "simulator.frontends.study:main", "validate-published": "simulator.validation.published:main",
               "validate-parallel": "simulator.validation.parallel_validation:main"}


#: The usage line names the subcommands beside the main form, so ``simulate --help`` shows them first.
USAGE = ("simulate --model MODEL --gpus GPUS [options]\n"
         f"       simulate {{{','.join(SUBCOMMANDS)}}} [options]")


class _ListModels(argparse.Action):
    """``--list-models``: print the model presets, one per line, and exit 0 (as ``--help`` does)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from ..model.presets import list_models

        print("\n".join(list_models()))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="simulate", usage=USAGE, description="How long and how much to pre-train a model on given "
                "GPUs: the fastest feasible settings, days with an 80% interval, and dollars. Each subcommand "
                "has its own `simulate SUBCOMMAND --help`.")
    p.add_argument("--model", required=True, help="preset (e.g. pythia-1b; see --list-models) or path to a Hugging "
                   "Face config.json")
    p.add_argument("--list-models", action=_ListModels, help="print the model presets and exit")
    p.add_argument("--gpus", required=True, help="8x3090, 2x8xa100-80gb, h100 or Nxlocal with --profile")
    p.add_argument("--profile", help="efficiency profile JSON written by `calibrate` (default: catalog profile)")
    p.add_argument("--profile-any-gpu", action="store_true", default=None,
                   help="apply --profile to the --gpus GPU even if the profile describes another device")
    p.add_argument("--intra-node", help="intra-node link id (e.g. pcie4-p2p, nvlink-bridge-3, nvswitch-3)")
    p.add_argument("--inter-node", type=_positive_float("--inter-node"), help="inter-node bandwidth per node, Gbit/s")
    p.add_argument("--host-memory", type=_positive_float("--host-memory"), help="host RAM per node, GiB (offload check)")
    p.add_argument("--overhead", type=fraction_arg("--overhead"),
                   help="extra wall-clock time beyond training steps (data loading, evaluation, checkpoints, "
                        "failures), e.g. 10%% or 0.1; default 0")
    from ..strategy.stacks import list_stacks

    p.add_argument("--stack", help=f"training software, not searched: {' | '.join(list_stacks())} "
                   "(default hf-trainer; see simulator/data/stacks.yaml)")
    add_recipe_args(p)
    k = p.add_argument_group("strategy (omit to search)")
    k.add_argument("--precision", help="fp32 | tf32 | bf16 | fp16 | fp8 (FP8 linear layers; pinned only, Hopper/Ada)")
    k.add_argument("--attention", help="eager | sdpa")
    k.add_argument("--compile", dest="compile", action="store_true", default=None, help="torch.compile")
    k.add_argument("--no-compile", dest="compile", action="store_false")
    k.add_argument("--checkpointing", help="none | selective | op | full | every:K (K-th layers only)")
    k.add_argument("--sharding", help="ddp | zero1 | zero2 | zero3 | fsdp-grad-op | fsdp-full")
    k.add_argument("--offload", help="none | optimizer | all")
    k.add_argument("--micro-batch", type=_positive_int("--micro-batch"), help="samples per micro-batch per GPU")
    k.add_argument("--tp", type=_positive_int("--tp"), help="tensor-parallel degree (divides the GPUs per node and the heads)")
    k.add_argument("--pp", type=_positive_int("--pp"), help="pipeline stages (1F1B)")
    k.add_argument("--vp", type=_positive_int("--vp"), help="virtual pipeline stages per GPU (interleaved 1F1B)")
    k.add_argument("--sequence-parallel", dest="sequence_parallel", action="store_true", default=None,
                   help="Megatron sequence parallelism with tensor parallelism")
    k.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false")
    k.add_argument("--async-tp", dest="async_tp", action="store_true", default=None,
                   help="overlap the tensor-parallel collectives with the GEMMs (searched where the stack offers it)")
    k.add_argument("--no-async-tp", dest="async_tp", action="store_false")
    k.add_argument("--cp", type=_positive_int("--cp"),
                   help="context-parallel degree: each sequence split over cp GPUs (ring attention); searched from 8k tokens")
    k.add_argument("--ep", type=_positive_int("--ep"),
                   help="expert-parallel degree of a mixture of experts (divides the experts and the data-parallel ranks)")
    k.add_argument("--etp", type=_positive_int("--etp"),
                   help="expert tensor-parallel degree: 1 runs whole experts under --tp (Megatron-Core's MoE parallel "
                        "folding: ep then divides tp × dp); default the tensor-parallel degree")
    k.add_argument("--capacity-factor", dest="capacity_factor", type=_positive_float("--capacity-factor"),
                   help="a mixture of experts' expert capacity: each expert's buffer is this many times its mean "
                        "tokens, the rest dropped and the buffer padded (force-balanced benchmarks: 1); default dropless")
    k.add_argument("--moe-dispatcher", dest="moe_dispatcher", choices=("alltoall", "deepep"),
                   help="how expert parallelism sends tokens: alltoall (NCCL, every routed copy; default) or deepep "
                        "(DeepEP: once per GPU and node holding the token's experts)")
    k.add_argument("--moe-routing", dest="moe_routing", choices=ROUTINGS,
                   help="where a token's experts lie: uniform (any top-k alike, a learned router; default) or "
                        "contiguous (consecutive experts: NeMo Automodel's fake_balanced_gate benchmarks)")
    k.add_argument("--overlap-grad-reduce", dest="overlap_grad_reduce", action=argparse.BooleanOptionalAction,
                   default=None, help="the data-parallel gradient reduction runs during backward (Megatron-LM "
                   "--overlap-grad-reduce; on for every stack but megatron-lm, whose default is off)")
    k.add_argument("--moe-a2a-overlap", dest="moe_a2a_overlap", action="store_true", default=None,
                   help="the expert all-to-all runs beside another micro-batch's compute (Megatron-LM "
                        "--overlap-moe-expert-parallel-comm); default not overlapped")
    from ..answer.costs import add_cost_args

    add_cost_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--top", type=_positive_int("--top"), help="also list the N best strategies")
    o.add_argument("--json", action="store_true", help="print one JSON object (see README)")
    return p


def _knobs(a: argparse.Namespace) -> dict:
    keys = ("profile", "profile_any_gpu", "intra_node", "inter_node", "host_memory", "overhead", "capacity_factor",
            "moe_dispatcher", "moe_a2a_overlap", "moe_routing", "overlap_grad_reduce",
            "tokens", "steps", "global_batch",
            "seq_len", "optimizer", "precision", "attention", "compile", "checkpointing", "sharding",
            "offload", "micro_batch", "stack", "tp", "pp", "vp", "sequence_parallel", "async_tp", "cp", "ep", "etp")
    out = {k: getattr(a, k) for k in keys if getattr(a, k) is not None}
    for k in ("precision", "attention", "checkpointing", "sharding", "offload", "optimizer", "stack"):
        if k in out:
            out[k] = str(out[k]).strip().lower()
    return out


def run(argv: list[str]) -> int:
    from ..answer import api
    from ..answer.costs import prices_from_args
    from ..answer.report import Console, render_plan

    args = build_parser().parse_args(argv)
    knobs = _knobs(args)
    prices = prices_from_args(args)
    ans = api.answer(args.model, args.gpus, prices=prices, top=args.top or 0, **knobs)
    plan, top = ans.plan, ans.top
    if args.json:
        d = plan.to_dict()
        if top:
            d["top"] = [t.to_dict() for t in top]
        print(json.dumps(d, indent=2, default=str, allow_nan=False))
    else:
        render_plan(plan, Console(), top)
    return 0 if plan.feasible else 1


def _dispatch(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        from ..core.errors import unknown

        raise unknown("subcommand", argv[0], list(SUBCOMMANDS))
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        mod, fn = SUBCOMMANDS[argv[0]].split(":")
        return int(getattr(importlib.import_module(mod), fn)(argv[1:]) or 0)
    return run(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``simulate`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("simulate", lambda: _dispatch(argv))


if __name__ == "__main__":
    sys.exit(main())
