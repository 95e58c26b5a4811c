#!/usr/bin/env bash
# flash-attn-4 in five carries: the working tree (13 MB in session 5, 22 MiB in 14, 26 MiB in 23, 40.5 MB in 42)
# plus the shared script's part A (.whl-fa4a, 54 MiB) is over the 64 MiB (67.1 MB) a device call may carry, and
# since session 42 so is the tree plus a 28 MB part (session 42's first fa4-0 call was refused).
#   bash ../shared/tools/device-wheels.sh fa4 && bash benchmarks/fa4_resplit.sh
# makes ignored folders .fa4-0 (the small wheels and the first 12 MB of the cu13 library wheel), .fa4-1, .fa4-2 and
# .fa4-3 (22 MB each: each carried beside the tree with ~4 MB to spare) and .fa4-4 (the rest, ~14 MB, and
# install.sh: room beside it for .whl, or .old). On the device, back to back (the machine goes back after 30 s idle,
# and /tmp with it):
#   carry [".fa4-0"]:      bash benchmarks/device_show.sh fa4-0   (copies the part to /tmp/fa4)
#   carry [".fa4-1"]:      bash benchmarks/device_show.sh fa4-1   (and so on to fa4-3)
#   carry [".fa4-4", ...]: any step: its setup runs .fa4-4/install.sh (joins, installs into /tmp/site)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ -f .whl-fa4a/cu13part_aa ] && [ -f .whl-fa4b/cu13part_ab ] || { echo "run ../shared/tools/device-wheels.sh fa4 first" >&2; exit 2; }
for d in /.fa4-0/ /.fa4-1/ /.fa4-2/ /.fa4-3/ /.fa4-4/; do
  grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
rm -rf .fa4-0 .fa4-1 .fa4-2 .fa4-3 .fa4-4 && mkdir -p .fa4-0 .fa4-1 .fa4-2 .fa4-3 .fa4-4
cp .whl-fa4a/*.whl .fa4-0/
# five parts of the 92 MB library wheel: every part plus the working tree must stay under a call's 64 MiB
cat .whl-fa4a/cu13part_aa .whl-fa4b/cu13part_ab > .fa4-0/cu13.whl.tmp
cut() { dd if=.fa4-0/cu13.whl.tmp of="$1" bs=4M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
cut .fa4-0/cu13_0 0 12000000
cut .fa4-1/cu13_1 12000000 22000000
cut .fa4-2/cu13_2 34000000 22000000
cut .fa4-3/cu13_3 56000000 22000000
cut .fa4-4/cu13_4 78000000
rm .fa4-0/cu13.whl.tmp
cat > .fa4-4/install.sh <<'INSTALL'
#!/usr/bin/env bash
# On the device, after .fa4-0 to .fa4-3 were copied to /tmp/fa4: join the library wheel, install all.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cat /tmp/fa4/cu13_0 /tmp/fa4/cu13_1 /tmp/fa4/cu13_2 /tmp/fa4/cu13_3 "$here"/cu13_4 > /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
rm -f /tmp/fa4/cu13_0 /tmp/fa4/cu13_1 /tmp/fa4/cu13_2 /tmp/fa4/cu13_3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/fa4/*.whl
echo "flash-attn-4 installed; export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
INSTALL
du -sh .fa4-0 .fa4-1 .fa4-2 .fa4-3 .fa4-4
