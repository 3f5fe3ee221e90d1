#!/bin/bash
# One GPU-machine call: env, the GPU benchmarks and the GPU tests (needs torchao wheel(s) in .whl/).
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c "import torch;print(torch.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability())"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
python3 -c "import torchao;print('torchao', torchao.__version__)"
mkdir -p $OUT/gpu
echo "=== env"; timeout 40 python3 -m amptrain env 2>&1 | tee $OUT/env.txt | head -40
echo "=== gpu.py"; timeout 270 python3 benchmarks/gpu.py --out $OUT/gpu --budget-s 240 --rounds 6 2>&1 | tee $OUT/gpu_log.txt | tail -80
echo "=== gpu_fp8.py"; timeout 110 python3 benchmarks/gpu_fp8.py --json $OUT/fp8.json --rounds 3 --curve-steps 150 2>&1 | tee $OUT/fp8_log.txt | tail -40
echo "=== tests"; timeout 100 python3 -m pytest -q -p no:cacheprovider tests/trainer/test_overhead.py tests/precision tests/compare/test_timing.py tests/trainer/test_optim.py tests/trainer/test_autobatch.py tests/trainer/test_data.py tests/report/test_context.py tests/common/test_reproducibility.py tests/distributed/test_base.py -k "cuda or gpu or fp8 or native or device" 2>&1 | tee $OUT/tests.txt | tail -30
