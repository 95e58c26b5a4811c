#!/usr/bin/env bash
# flashinfer (issue 19: another FP8 attention with a wheel usable on the box) for the offline device machine.
#   bash benchmarks/flashinfer_wheels.sh
# downloads flashinfer-python and its dependencies' cp312 manylinux wheels (this machine has an index; the
# device has none) and splits them into ignored folders that each fit one device call beside the working tree
# (64 MiB a call; the tree is ~25 MiB): .fi-1 (the first 42% of the 62 MB flashinfer wheel, and cuda-bindings),
# .fi-2 (the rest of it), .fi-3 (the other dependencies but nccl-extensions, and install.sh), .fi-4 (nccl-extensions,
# 22.6 MB). flashinfer also needs nvidia-cutlass-dsl (flash-attn-4's wheels: benchmarks/fa4_resplit.sh) and
# nvidia-cudnn-frontend (.whl-cudnn, carried with .fi-4). On the device, back to back (a machine goes back after
# 30 s idle, /tmp with it):
#   carry [".fi-1"]: bash benchmarks/device_show.sh fi-1     (copies the part to /tmp/fi)
#   carry [".fi-2"]: bash benchmarks/device_show.sh fi-2
#   carry [".fi-4", ".whl-cudnn"]: bash benchmarks/device_show.sh fi-4
#   carry [".fa4-1"]: bash benchmarks/device_show.sh fa4-1;  ... to fa4-N alike (benchmarks/fa4_resplit.sh)
#   carry [".fa4-in", ".fi-3"]: bash benchmarks/device_show.sh flashinfer-fp8  (setup installs both, then the probe)
# flashinfer JIT-compiles its kernels with the box's nvcc (/usr/local/cuda-13.0/bin/nvcc) on first use.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
version=${FLASHINFER_VERSION:-0.7.2.post1}
for d in /.fi-1/ /.fi-2/ /.fi-3/ /.fi-4/ /.fi-dl/; do
  grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
rm -rf .fi-1 .fi-2 .fi-3 .fi-4 && mkdir -p .fi-1 .fi-2 .fi-3 .fi-4 .fi-dl
pip download -q --no-deps -d .fi-dl "flashinfer-python==$version"
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .fi-dl \
    "apache-tvm-ffi>=0.1.11,<0.2" cuda-python cuda-bindings cuda-pathfinder "cuda-tile>=1.4.0" \
    "nccl-extensions>=0.1.0" "nccl4py>=0.4.1" ninja nvidia-ml-py click tabulate
whl=$(ls .fi-dl/flashinfer_python-"$version"-*.whl)
size=$(stat -c %s "$whl")
half=$(( size * 42 / 100 ))  # 26 MB here: .fi-1 also takes cuda-bindings (8.4 MB); every call <= 60 MiB with the tree
dd if="$whl" of=.fi-1/fi_a bs=4M iflag=count_bytes count="$half" status=none
dd if="$whl" of=.fi-2/fi_b bs=4M iflag=skip_bytes skip="$half" status=none
sha256sum "$whl" | cut -d' ' -f1 > .fi-3/fi.sha256
basename "$whl" > .fi-3/fi.name
mv .fi-dl/nccl_extensions-*.whl .fi-4/
mv .fi-dl/cuda_bindings-*.whl .fi-1/  # 8.4 MB: the last call carries .fa4-in (install.sh alone) with .fi-3
find .fi-dl -name '*.whl' ! -name 'flashinfer_python-*' -exec mv {} .fi-3/ \;
cat > .fi-3/install.sh <<'INSTALL'
#!/usr/bin/env bash
# On the device, after .fi-1, .fi-2 and .fi-4 were copied to /tmp/fi: join the flashinfer wheel, check it, install.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=$(cat "$here/fi.name")
cat /tmp/fi/fi_a /tmp/fi/fi_b > "/tmp/fi/$name"
[ "$(sha256sum "/tmp/fi/$name" | cut -d' ' -f1)" = "$(cat "$here/fi.sha256")" ] || { echo "flashinfer wheel: bad join" >&2; exit 1; }
rm -f /tmp/fi/fi_a /tmp/fi/fi_b
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "/tmp/fi/$name" \
    /tmp/fi/*.whl "$here"/*.whl
echo "flashinfer installed into /tmp/site"
INSTALL
rm -rf .fi-dl
du -sh .fi-1 .fi-2 .fi-3 .fi-4
