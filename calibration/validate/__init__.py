"""``validate``: real training steps in torch against the simulator's predicted step time.

For every configuration of a suite (``calibration/suites/*.yaml``) it builds the model
(:mod:`calibration.torch_model`), runs warm-up steps and then timed optimizer steps (forward,
backward, gradient clipping at 1.0 and AdamW; gradient accumulation; bf16 autocast; eager or SDPA; full or selective
activation checkpointing; ``torch.compile``), takes the median of the timed steps, and compares it
with ``simulator.answer.api.simulate(..., "Nxlocal", profile=...)`` per pass (forward, backward,
recomputation timed inside backward, optimizer) and per step. Times are in seconds. On CUDA it also
records the timed steps' peak memory (``torch.cuda.max_memory_allocated`` and
``max_memory_reserved``, GiB) beside the predicted peaks (:func:`predicted_peaks`); a CPU leaves
the measured columns empty.

Under ``torchrun --nproc-per-node N`` (or ``--nproc N``, which launches torchrun) the model is
wrapped in DDP (gloo on CPU, NCCL on CUDA), accumulation skips gradient sync until the last
micro-batch, and each rank's step time is reduced to the slowest rank's.

The training steps are the check, never the fit: nothing here changes simulator constants;
``--update-profile`` only stores the residuals log(measured / predicted) for intervals.

The package, one job a module: :mod:`.suite` reads suites, :mod:`.measuring` times real steps
(torch), :mod:`.predicting` asks the simulator, :mod:`.devices` checks the profile is the device's,
:mod:`.report` compares and summarizes, :mod:`.files` writes the CSV and profile, :mod:`.cli` is the
command (``python -m calibration.validate``; exit status 0 success, 1 runtime failure, 2 usage
error, 130 interrupted). Its public names are re-exported here.
"""

from .cli import MAX_STEPS, build_parser, main, run
from .devices import check_device
from .files import merge_csv, read_measured, update_profile
from .measuring import (
    GIB,
    MAX_ROUND_STEPS,
    Dist,
    Measured,
    init_dist,
    measure,
    merge_measured,
    round_steps,
    timed_steps,
)
from .predicting import check_fits_memory, predict, predicted_peaks
from .report import (
    COMPONENTS,
    CSV_FIELDS,
    draw_coverage,
    format_table,
    make_row,
    summarize,
    summarize_memory,
)
from .suite import (
    DEFAULT_SUITE,
    GPU_DEFAULT_SUITE,
    MEASURED_PRECISIONS,
    MIN_ROUND_S,
    SUITE_DIR,
    Config,
    Suite,
    check_min_round_s,
    config_id,
    load_suite,
)

__all__ = [
    "COMPONENTS", "CSV_FIELDS", "DEFAULT_SUITE", "GIB", "GPU_DEFAULT_SUITE", "MAX_ROUND_STEPS", "MAX_STEPS",
    "MEASURED_PRECISIONS", "MIN_ROUND_S", "SUITE_DIR", "Config", "Dist", "Measured", "Suite", "build_parser",
    "check_device", "check_fits_memory", "check_min_round_s", "config_id", "draw_coverage", "format_table",
    "init_dist", "load_suite", "main", "make_row", "measure", "merge_csv", "merge_measured", "predict",
    "predicted_peaks", "read_measured", "round_steps", "run", "summarize", "summarize_memory", "timed_steps",
    "update_profile",
]
