#!/usr/bin/env bash
# flash-attn-4 in four carries: the working tree (13 MB in session 5, 22 MiB in 14, 26 MiB in 23) plus the
# shared script's part A (.whl-fa4a, 54 MiB) is over the 64 MiB a device call may carry, and since session 23
# so is the tree plus a 39 MiB part.
#   bash ../shared/tools/device-wheels.sh fa4 && bash benchmarks/fa4_resplit.sh
# makes ignored folders .fa4-0 (the small wheels and the first 18 MB of the cu13 library wheel), .fa4-1 and
# .fa4-2 (28 MB each) and .fa4-3 (the rest, ~18 MB, and install.sh: room beside it for .whl, .whl-cudnn or
# .fi-3). On the device, back to back (the machine goes back after 30 s idle, and /tmp with it):
#   carry [".fa4-0"]:      bash benchmarks/device_show.sh fa4-0   (copies the part to /tmp/fa4)
#   carry [".fa4-1"]:      bash benchmarks/device_show.sh fa4-1
#   carry [".fa4-2"]:      bash benchmarks/device_show.sh fa4-2
#   carry [".fa4-3", ...]: any step: its setup runs .fa4-3/install.sh (joins, installs into /tmp/site)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ -f .whl-fa4a/cu13part_aa ] && [ -f .whl-fa4b/cu13part_ab ] || { echo "run ../shared/tools/device-wheels.sh fa4 first" >&2; exit 2; }
for d in /.fa4-0/ /.fa4-1/ /.fa4-2/ /.fa4-3/; do
  grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
rm -rf .fa4-0 .fa4-1 .fa4-2 .fa4-3 && mkdir -p .fa4-0 .fa4-1 .fa4-2 .fa4-3
cp .whl-fa4a/*.whl .fa4-0/
# four parts of the 92 MB library wheel: every part plus the working tree must stay under a call's 64 MiB
cat .whl-fa4a/cu13part_aa .whl-fa4b/cu13part_ab > .fa4-0/cu13.whl.tmp
cut() { dd if=.fa4-0/cu13.whl.tmp of="$1" bs=4M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
cut .fa4-0/cu13_0 0 18000000
cut .fa4-1/cu13_1 18000000 28000000
cut .fa4-2/cu13_2 46000000 28000000
cut .fa4-3/cu13_3 74000000
rm .fa4-0/cu13.whl.tmp
cat > .fa4-3/install.sh <<'INSTALL'
#!/usr/bin/env bash
# On the device, after .fa4-0, .fa4-1 and .fa4-2 were copied to /tmp/fa4: join the library wheel, install all.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cat /tmp/fa4/cu13_0 /tmp/fa4/cu13_1 /tmp/fa4/cu13_2 "$here"/cu13_3 > /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
rm -f /tmp/fa4/cu13_0 /tmp/fa4/cu13_1 /tmp/fa4/cu13_2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/fa4/*.whl
echo "flash-attn-4 installed; export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
INSTALL
du -sh .fa4-0 .fa4-1 .fa4-2 .fa4-3
