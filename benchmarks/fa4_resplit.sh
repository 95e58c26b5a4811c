#!/usr/bin/env bash
# flash-attn-4 in as many carries as the working tree leaves room for. A device call carries at most 64 MiB (67.1
# MB): the tracked tree (13 MB in session 5, 40.5 MB in 42, 44 MB in 56, as tar with ~2.5 MB of headers) plus the
# carried folders. Session 56's first fa4-0 call was refused with the fixed five parts of session 42 (22 MB each), so
# the part size is now computed from the tree:
#   bash ../shared/tools/device-wheels.sh fa4 && bash benchmarks/fa4_resplit.sh
# makes ignored folders .fa4-0 (the small wheels and the start of the cu13 library wheel), .fa4-1 .. .fa4-N (the
# rest of it, each part sized to ride beside the tree) and .fa4-in (install.sh alone: room beside it for .whl and
# .old). It prints N. On the device, back to back (the machine goes back after 30 s idle, and /tmp with it):
#   carry [".fa4-0"]:       bash benchmarks/device_show.sh fa4-0   (copies the part to /tmp/fa4)
#   carry [".fa4-1"]:       bash benchmarks/device_show.sh fa4-1   (and so on to fa4-N)
#   carry [".fa4-in", ...]: any step: its setup runs .fa4-in/install.sh (joins the parts, installs into /tmp/site)
# Re-run it whenever the tree grows by a few MB (a refused call says "larger than 64 MiB").
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ -f .whl-fa4a/cu13part_aa ] && [ -f .whl-fa4b/cu13part_ab ] || { echo "run ../shared/tools/device-wheels.sh fa4 first" >&2; exit 2; }
grep -qxF "/.fa4-*/" .git/info/exclude 2>/dev/null || echo "/.fa4-*/" >> .git/info/exclude
rm -rf .fa4-[0-9]* .fa4-in && mkdir -p .fa4-0 .fa4-in
cp .whl-fa4a/*.whl .fa4-0/
# the tree as a call carries it: the tracked files' bytes, plus a 512-byte header and up to 511 bytes of padding each
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ n++; s += $1 } END { print s + n * 1024 }')
limit=$((64 * 1024 * 1024))
margin=$((3 * 1000 * 1000))  # room for the tree to grow by a session or two before the next resplit
part=$((limit - tree - margin))
wheels=$(du -cb .fa4-0/*.whl | tail -n 1 | cut -f1)
first=$((part - wheels))
((first > 1000000)) || { echo "the tree ($tree bytes) leaves no room for a part: $part bytes" >&2; exit 2; }
lib=.fa4-in/cu13.whl.tmp
cat .whl-fa4a/cu13part_aa .whl-fa4b/cu13part_ab > "$lib"
total=$(stat -c %s "$lib")
cut() { dd if="$lib" of="$1" bs=4M iflag=skip_bytes,count_bytes skip="$2" count="$3" status=none; }
cut .fa4-0/cu13_0 0 "$first"
off=$first n=0
while ((off < total)); do
    n=$((n + 1)); mkdir -p ".fa4-$n"
    cut ".fa4-$n/cu13_$n" "$off" "$part"
    off=$((off + part))
done
rm "$lib"
cat > .fa4-in/install.sh <<INSTALL
#!/usr/bin/env bash
# On the device, after .fa4-0 to .fa4-$n were copied to /tmp/fa4: join the library wheel, install all.
set -euo pipefail
parts=\$(for i in \$(seq 0 $n); do echo /tmp/fa4/cu13_\$i; done)
for p in \$parts; do [ -f "\$p" ] || { echo "flash-attn-4: \$p missing (run fa4-0 .. fa4-$n first, back to back)" >&2; exit 2; }; done
cat \$parts > /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
rm -f \$parts
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/fa4/*.whl
echo "flash-attn-4 installed; export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
INSTALL
echo "tree $tree bytes; parts of $part bytes: carry .fa4-0 .. .fa4-$n one a call (steps fa4-0 .. fa4-$n), then .fa4-in"
du -sh .fa4-[0-9]* .fa4-in
