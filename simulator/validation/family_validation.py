"""Published training runs of a model family other than the transformer, their residuals, and
the GPU parameters fitted on them.

The profiles' intervals come from transformer runs (``Profile.validation``). A family with
published runs of its own (Mamba: fla-org/flash-linear-attention#32) widens its predictions'
interval with its own held-out residuals: :func:`interval` is the union of the profile's 80%
interval and the family's, so the headline is never more optimistic than the family's own
validation.

``data/family_validation.json`` holds, per family, the measured runs (typed in from their source,
settings the source does not state labelled INFERRED in ``note``), and, written only by the
command below, the fitted ``fp32_atomic_rate`` per GPU group (mamba-ssm's scan backward: fp32
atomicAdds into dB and dC; fitted with ``calibrate --from-runs``'s bounded least squares) and the
predictions and held-out residuals::

    python -m calibration.family_fit

A test re-predicts every run and fails when the stored predictions no longer match the physics.
"""

from __future__ import annotations

from ..answer.api import simulate
from ..answer.family_runs import FamilyRun, FamilyValidation
from ..model.families import spec_from_dict


def predict(v: FamilyValidation, run: FamilyRun) -> float:
    """Predicted tokens/s of one published run under its stated settings (default profile)."""
    return float(simulate(spec_from_dict(v.model), f"1x{run.gpu}", stack=v.stack, **run.knobs()).tokens_per_s)
