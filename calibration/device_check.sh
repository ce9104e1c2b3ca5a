#!/usr/bin/env bash
# One prepared GPU check, for a session that is lent a GPU machine (one call, about 10 minutes):
#   1. calibrate --quick on the GPU                       -> $OUT/profile.json (+ measurements)
#   2. validate real training steps with that profile     -> $OUT/validation.csv, intervals in the profile
#   3. re-predict the same measured steps with the catalog's DEFAULT (published) profile of this GPU
#      (validate --measured: no second run on the device)  -> $OUT/validation_default.log
#   4. where megatron-core imports (its wheel in .whl/), Megatron's host time per kernel
#      (python -m calibration.stack_dispatch)            -> $OUT/stack_dispatch.csv
# Bring the files back and commit them under calibration/profiles/ and calibration/results/ with
# the date and the hardware. Needs torch with CUDA and this package's dependencies; where pydantic
# is missing (the H200 image), carry wheels in .whl/ (see the device tool's README).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 3
else
  export PYTHONPATH=$PWD
fi
python3 -c "import torch, pydantic, scipy, yaml, rich; assert torch.cuda.is_available(); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" || exit 3
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv" 2>&1
cat "$OUT/nvidia-smi.csv"

timeout 300 python3 -m calibration --quick --no-progress --out "$OUT/profile.json" 2>&1 | tee "$OUT/calibrate.log"
timeout 240 python3 -m calibration.validate --suite calibration/suites/gpu_default.yaml --profile "$OUT/profile.json" --csv "$OUT/validation.csv" \
  --update-profile 2>&1 | tee "$OUT/validate.log"
gpu_id=$(python3 -c "import json; print(json.load(open('$OUT/profile.json'))['device'].get('gpu_id') or '')" 2>/dev/null)
if [ -n "$gpu_id" ] && [ -f "hardware_catalog/profiles/$gpu_id.json" ]; then
  timeout 60 python3 -m calibration.validate --measured "$OUT/validation.csv" --suite calibration/suites/gpu_default.yaml \
    --profile "hardware_catalog/profiles/$gpu_id.json" 2>&1 | tee "$OUT/validation_default.log"
fi
if python3 -c "import megatron.core" >/dev/null 2>&1; then  # its wheel in .whl/: Megatron's host time per kernel
  timeout 45 python3 -m calibration.stack_dispatch --steps 100 --out "$OUT/stack_dispatch.csv" 2>&1 | grep -v -i warn | tee "$OUT/stack_dispatch.log"
fi
ls -la "$OUT"
