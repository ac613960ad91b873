# D2: the one-layer variants and phase trace, then the kernel and engine tests with the persistent launch on
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
timeout 200 python3 .carry/scratch/variants.py > $OUT/variants.txt 2>&1; grep -v -i warn $OUT/variants.txt | tail -40
DSPARK_PERSISTENT=1 timeout 260 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_kernels.py tests/test_cuda.py \
  -k "attention or test_cuda" > $OUT/tests.txt 2>&1; tail -5 $OUT/tests.txt
