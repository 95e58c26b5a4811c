#!/usr/bin/env bash
# The GPU shows of the issues, one step per device call (docs/device-runbook.md says why the steps
# are cut this way: 64 MiB carried, 8 files back, 600 s a call, /tmp lost when the machine idles).
#
#   bash benchmarks/device_show.sh STEP      (on the device machine, from the repo root)
#
# Steps: install | fa4a | fa4-0 .. fa4-N [STEP...] | fi-1|fi-2|fi-4 [STEP...] | flashinfer-fp8 | flashinfer-bench | flashinfer-warm | accept-flashinfer | hd256-bwd | new-gpu | fp8 | fp8-mma | fp8-overlap | desc-cost | fp8-must | fp8-bwd-ours | fp8-sweep | fp8-configs | issue17 | issue17b | cudnn-fp8 | fp8-out | correctness | accept-ours | accept-gqa | accept-fa4 | accept-pair IMPL SECONDS | trust-gpu | audit-measure | fuzz-shrink | fuzz-10m A|B | triage | triage2 | la-fix | main-job | decode | accept-decode | layers [attention-layers|models] | overhead | host-ab | route-ab | probe-whole | timeline | persistent | host-floors | pipes | launch-check | gate | gate-linear | fa-sweep | fa-sweep-rest |
#        gluon-ws | gluon-bwd | gluon-route | fused-ordered | fused-adder | gqa-walks | linear | linear-graphs [DTYPE] | linear-kernels [64|128] | gpu-tests [fp16|bf16|fp32] | multi-gpu [DTYPE]
# Every step installs what is missing, writes its reports under $OUT (tarred: only 8 files come
# back) and prints a short summary last.
set -u
OUT=${OUT:-$PWD/reports/device}
mkdir -p "$OUT"
step=${1:?usage: device_show.sh STEP}

setup() {
    if [ ! -d /tmp/site/nox ] && [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
    fi
    if [ ! -d /tmp/site/flash_attn ] && [ -d .whl-fa4b ] && [ -d /tmp/fa4a ]; then
        bash .whl-fa4b/install.sh >/dev/null 2>&1
    fi
    if [ ! -d /tmp/site/flash_attn ] && [ -d .fa4-in ] && [ -d /tmp/fa4 ]; then  # benchmarks/fa4_resplit.sh
        bash .fa4-in/install.sh 2>&1 | grep -v '^flash-attn-4 installed' || true
    fi
    if [ ! -d /tmp/site/flashinfer ] && [ -d .fi-3 ] && [ -d /tmp/fi ]; then  # benchmarks/flashinfer_wheels.sh
        bash .fi-3/install.sh 2>&1 | tail -n 3
    fi
    export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD PYTHONUNBUFFERED=1
    python3 - <<'PY'
import importlib.util as u
print("installed:", {m: bool(u.find_spec(m)) for m in ("nox", "fla", "flash_attn", "flashinfer")})
PY
}

tarred() {  # tarred NAME: pack $OUT/NAME into $OUT/NAME.tgz
    (cd "$OUT" && tar czf "$1.tgz" "$1" && rm -rf "$1")
}

summary() {  # summary FILE N: the last N lines of a log, to read in the call's output
    echo "---- $1"; tail -n "${2:-15}" "$1"
}

bwd_gluon_tests() {  # bwd_gluon_tests DIR K SECONDS: tests/kernels/test_bwd_gluon.py's GPU tests matching K (pinned
    # configs, 8 workers) under one timeout (a wrong add order hangs), logged to $OUT/DIR/tests.log; returns pytest's
    # status. TEST_FILES (space-separated): other test files instead (e.g. test_gluon_ws.py's forward tests beside)
    # shellcheck disable=SC2086
    FLASH_ATTN_AUTOTUNE=0 timeout "$3" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -n 8 -m gpu \
        --durations=8 ${TEST_FILES:-tests/kernels/test_bwd_gluon.py} -k "$2" > "$OUT/$1/tests.log" 2>&1
    local rc=$?
    echo "tests exit $rc" >> "$OUT/$1/tests.log"
    return $rc
}

accept() {  # accept IMPL SECONDS [ROOT]: the training-gqa profile in bf16, with the speed section
    # (fp16 too would not fit one call: the speed section takes ~100 s per dtype). ROOT: run the
    # harness found there (e.g. .old, an earlier commit's harness/ and kernels/), from there.
    # Each run compiles into its own Triton cache: no run inherits another's compiles.
    local name=acc-${1##*:}${3:+-$(basename "$3")} root=${3:-.} start
    start=$(date +%s)
    (cd "$root" && TRITON_CACHE_DIR=/tmp/tc-$name timeout "$2" python3 -m harness accept --impl "$1" \
        --profile training-gqa --device cuda --dtypes bf16 --jobs 7 --timeout 200 --out "$OUT/$name") \
        > "$OUT/$name.log" 2>&1
    echo "accept $1 ($root) exit $? after $(( $(date +%s) - start )) s" >> "$OUT/$name.log"
    tarred "$name"
}

gate() {  # issue 7: bench saves a baseline; a slowed backend fails bench-compare; a re-run passes
    local opts=(--attn-impl benchmarks.slowed_backend:attention --attn-backends benchmarks.slowed_backend:attention
                --attn-preset configs --attn-dtypes bf16 -k "H32- and fwd and not fwd+bwd")
    rm -rf .benchmarks
    mkdir -p "$OUT/gate"
    timeout 140 python3 -m nox --no-venv -s bench -- "${opts[@]}" > "$OUT/gate/1-baseline.log" 2>&1
    echo "baseline exit $?" | tee -a "$OUT/gate/1-baseline.log"
    SLOWED_BACKEND_EXTRA_RUNS=1 timeout 90 python3 -m nox --no-venv -s bench-compare -- "${opts[@]}" \
        > "$OUT/gate/2-slowed.log" 2>&1
    echo "slowed exit $? (must be non-zero)" | tee -a "$OUT/gate/2-slowed.log"
    timeout 90 python3 -m nox --no-venv -s bench-compare -- "${opts[@]}" > "$OUT/gate/3-rerun.log" 2>&1
    echo "rerun exit $? (must be 0)" | tee -a "$OUT/gate/3-rerun.log"
    cp -r .benchmarks "$OUT/gate/" 2>/dev/null; tarred gate
}

shrink_case() {  # shrink_case DIR NAME BACKEND CASE SEED [--family F]: `harness shrink` into DIR/NAME (400 s at
    # most, FLA's tuners pinned), then each repro script it wrote run once (exit 1: the defect reproduced)
    local d=$1 name=$2 backend=$3 case=$4 seed=$5 s rc; shift 5
    ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 400 python3 -m harness shrink --backend "$backend" --case "$case" \
        --seed "$seed" --timeout 90 "$@" --out "$d/$name" > "$d/$name.log" 2>&1
    echo "shrink exit $?" >> "$d/$name.log"
    for s in "$d/$name"/repro_*.py; do
        [ -f "$s" ] || continue
        timeout 120 python3 "$s" > "$d/$name/repro.out" 2>&1
        rc=$?  # (read before any command substitution: $(...) resets it)
        echo "repro ${s##*/} exit $rc (1: the defect reproduced)" >> "$d/$name.log"
    done
}

linear_kernels() {  # linear_kernels SECONDS BUDGET [DIMS]: the in-repo linear kernels against FLA (issue 5)
    # shellcheck disable=SC2086  # DIMS is a list
    timeout "$1" python3 benchmarks/bench_linear_attn.py --dims ${3:-64 128} --T 1024 2048 4096 8192 16384 \
        --dtypes fp16 bf16 --gate gamma --skip-check --time-budget "$2" \
        --backends ours fla_chunk fla_fused --out "$OUT/la" > "$OUT/la.log" 2>&1
    echo "bench_linear_attn exit $?" >> "$OUT/la.log"
    tarred la
}

case "$step" in
fa4a)  # part A of flash-attn-4 (carry .whl-fa4a alone)
    mkdir -p /tmp/fa4a && cp .whl-fa4a/* /tmp/fa4a/ && ls /tmp/fa4a | wc -l
    ;;
fa4-[0-9]|fa4-[0-9][0-9])  # flash-attn-4 in parts (benchmarks/fa4_resplit.sh): parts 0 to N, each carried alone;
    # `fa4-1 STEP ARGS...` then runs STEP in the same call (the part is copied first)
    mkdir -p /tmp/fa4 && cp ".$step"/* /tmp/fa4/ && ls /tmp/fa4 | wc -l
    if [ -n "${2:-}" ]; then shift; exec bash "$0" "$@"; fi
    ;;
install)  # what the carried folders hold (.whl; .fa4-in after fa4-0 to fa4-N; .fi-3 after fi-1, fi-2, fi-4) into
    # /tmp/site, and which of nox / fla / flash_attn / flashinfer import: for a raw command after it in the same call
    # (which then exports PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD itself). Every other
    # step does this first; session 43 ran `fa4-4`, no step, and its bench lost flash-attn-4's column
    setup
    ;;
fi-1|fi-2|fi-4)  # flashinfer in four carries (benchmarks/flashinfer_wheels.sh): parts 1, 2 and 4, each carried alone;
    # `fi-1 STEP ARGS...` then runs STEP in the same call (the part is copied first)
    mkdir -p /tmp/fi && cp ".$step"/* /tmp/fi/ && ls /tmp/fi | wc -l
    [ "$step" = fi-4 ] && [ -d .whl-cudnn ] && cp .whl-cudnn/*.whl /tmp/fi/  # cuDNN's frontend, a flashinfer dep
    if [ -n "${2:-}" ]; then shift; exec bash "$0" "$@"; fi
    ;;
flashinfer-fp8)  # issue 19: flashinfer's FP8 prefill, first contact (carry [".fa4-in", ".fi-3"] after fi-1, fi-2,
    # fi-4 and fa4-0 to fa4-N: benchmarks/flashinfer_wheels.sh): import, scale convention, error against the FP64
    # oracle beside the in-repo FP8 forward, time
    setup
    timeout "${FI_SECONDS:-500}" python3 benchmarks/flashinfer_fp8_probe.py ${FI_ARGS:-} > "$OUT/flashinfer-fp8.md" 2>&1
    echo "probe exit $?" >> "$OUT/flashinfer-fp8.md"
    cat "$OUT/flashinfer-fp8.md"
    ;;
flashinfer-bench)  # issue 19: flashinfer's FP8 prefill (adapter flashinfer_fp8) through the harness beside the
    # in-repo and cuDNN FP8 forwards and the in-repo bf16 forward, one run (carry .fi-3 after fi-1, fi-2, fi-4;
    # flashinfer JIT-compiles each head dim's module first, ~100 s each). FI_CASES / FI_LIMIT pick the cells.
    setup
    timeout "${FI_SECONDS:-560}" python3 -m harness bench --preset fp8-sweep --modes fwd --no-plots \
        --time-limit "${FI_LIMIT:-470}" --backends flashinfer_fp8,triton_fa_fp8,triton_fa,cudnn_fp8 \
        --cases "${FI_CASES:-S(4096|16384)x[0-9]+-D(64|128)-}" --out "$OUT/fi-bench" > "$OUT/fi-bench.log" 2>&1
    echo "bench exit $?" >> "$OUT/fi-bench.log"
    tail -n 3 "$OUT/fi-bench.log"
    grep -A 40 "TFLOP/s by" "$OUT/fi-bench/report.md" | head -n 60
    tarred fi-bench
    ;;
flashinfer-warm)  # flashinfer JIT-builds its FP8 batch-prefill module per head dim (~100 s each) on first use: build
    # hd 64 / 128 / 256 once on this machine (~/.cache/flashinfer), so that the next call (accept-flashinfer) times
    # kernels, not nvcc. Carry .fi-3 (after fi-1, fi-2, fi-4).
    setup
    timeout 560 python3 - <<'PY' 2>&1 | tail -n 5
import time
import torch
from harness.adapters.flashinfer_fp8 import flashinfer_fp8_attention
for d in (64, 128, 256):
    t = time.time()
    q = torch.randn(1, 256, 4, d, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(1, 256, 2, d, device="cuda").to(torch.float8_e4m3fn)
    ds = torch.ones(1, 2, device="cuda")
    for causal in (False, True):
        flashinfer_fp8_attention(q, k, k, ds, ds, ds, causal=causal)
    torch.cuda.synchronize()
    print(f"hd {d}: built and ran in {time.time() - t:.0f} s", flush=True)
PY
    ;;
accept-flashinfer)  # issue 19: a vendor FP8 kernel through `accept --profile fp8` (flashinfer's FP8 prefill behind
    # flash-attn 3's FP8 signature, harness.accept.shims:flashinfer_fp8), with the speed section; carry .fi-3 on the
    # machine flashinfer-warm left warm
    setup
    TRITON_CACHE_DIR=/tmp/tc-acc-fi timeout 560 python3 -m harness accept --impl harness.accept.shims:flashinfer_fp8 \
        --profile fp8 --device cuda --jobs 4 --timeout 300 --out "$OUT/acc-flashinfer" > "$OUT/acc-flashinfer.log" 2>&1
    echo "accept exit $?" >> "$OUT/acc-flashinfer.log"
    tail -n 30 "$OUT/acc-flashinfer.log"
    tarred acc-flashinfer
    ;;
hd256-bwd)  # issue 16: the bf16 backward's hd 256 tiles (session 23) on the GPU: the hd 256 kernel tests, then the
    # Gemma-2-9B row of `models` and the FA sweep's hd 256 at 4k through the harness (every cell checked
    # against the FP64 oracle before it is timed), CUDA graphs, the torch backends beside it
    setup
    FLASH_ATTN_AUTOTUNE=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_flash_attn.py \
        -k "D256 or 256_works" > "$OUT/hd256-tests.log" 2>&1
    echo "tests exit $?" >> "$OUT/hd256-tests.log"
    timeout 200 python3 -m harness bench --preset models --modes fwd,bwd --no-plots --no-memory --cuda-graphs \
        --backends sdpa_flash,sdpa_cudnn,sdpa_efficient,triton_fa --cases 'D256-causal-cap50' \
        --out "$OUT/hd256-bwd/models" --quiet > "$OUT/hd256-models.log" 2>&1
    echo "models exit $?" >> "$OUT/hd256-models.log"
    timeout 200 python3 -m harness bench --preset fp8-sweep --modes fwd,bwd --no-plots --no-memory --cuda-graphs \
        --backends sdpa_flash,sdpa_cudnn,triton_fa --cases 'S4096x4096-D256-(causal-)?bf16$' \
        --out "$OUT/hd256-bwd/sweep" --quiet > "$OUT/hd256-sweep.log" 2>&1
    echo "sweep exit $?" >> "$OUT/hd256-sweep.log"
    summary "$OUT/hd256-tests.log" 3; tail -n 1 "$OUT/hd256-models.log" "$OUT/hd256-sweep.log"
    grep -h -A 8 "TFLOP/s, " "$OUT/hd256-bwd/models/report.md" "$OUT/hd256-bwd/sweep/report.md" | head -n 60
    tarred hd256-bwd
    ;;
correctness)  # issue 3 (every adapter, presets, fp16+bf16) and issue 8 (flash-attn-4 accepted)
    setup
    # FLA's first-time autotuning was ~100 s per small case: correctness runs pin its first config
    ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 300 python3 -m harness run --dtypes fp16,bf16 --jobs 8 \
        --out "$OUT/run" > "$OUT/run.log" 2>&1
    echo "harness run exit $?" >> "$OUT/run.log"
    tarred run
    accept harness.accept.shims:flash_attn_cute 260
    summary "$OUT/run.log" 12; summary "$OUT/acc-flash_attn_cute.log" 6
    ;;
accept-gqa)  # issue 16: the in-repo kernel under `accept --profile training-gqa` (bf16, with the speed section), alone
    setup
    accept kernels.flash_attn:flash_attn_func 270
    summary "$OUT/acc-flash_attn_func.log" 8
    ;;
accept-ours)  # issue 8 (the in-repo kernel accepted, with its speed section) and issue 7 (the gate)
    setup
    accept kernels.flash_attn:flash_attn_func 250
    gate
    summary "$OUT/acc-flash_attn_func.log" 6
    ;;
fa-sweep)  # issues 4 and 6: the FA-paper sweep, the fast backends, hd 64 and 128, with memory (FA_MODES: the modes,
    # default fwd,bwd,fwd+bwd; FA_CASES: a case-id regex, e.g. D64- for hd 64 only; FA_TESTS: a -k expression of
    # test_bwd_gluon.py's GPU tests run first, e.g. after a route change; FA_SECONDS: the bench's time limit, 520;
    # FA_BACKENDS: the backends, default sdpa_flash,sdpa_cudnn,flash_attn_cute,triton_fa; add triton_fa_det for the
    # kernel's default, deterministic call beside it)
    setup
    mkdir -p "$OUT/fa"
    if [ -n "${FA_TESTS:-}" ]; then
        bwd_gluon_tests fa "$FA_TESTS" 150; tail -n 3 "$OUT/fa/tests.log"
    fi
    timeout $(( ${FA_SECONDS:-520} + 40 )) python3 -m harness bench --preset fa-sweep --dtypes bf16 \
        --backends "${FA_BACKENDS:-sdpa_flash,sdpa_cudnn,flash_attn_cute,triton_fa}" \
        --modes "${FA_MODES:-fwd,bwd,fwd+bwd}" \
        ${FA_CASES:+--cases "$FA_CASES"} \
        --target-ms 25 --time-limit "${FA_SECONDS:-520}" --quiet --out "$OUT/fa" > "$OUT/fa.log" 2>&1
    echo "bench exit $?" >> "$OUT/fa.log"
    tarred fa; summary "$OUT/fa.log" 40
    ;;
fa-sweep-rest)  # issue 6: the slow backends on the same sweep, and the seeds' MHA/GQA/MQA/MLA configs
    setup
    timeout 560 python3 -m harness bench --preset fa-sweep,configs --dtypes bf16 \
        --backends eager,sdpa_efficient,flex,sdpa_flash,sdpa_cudnn,flash_attn_cute,triton_fa --modes fwd,bwd \
        --cases 'S(512|2048|8192)x|^B2-' \
        --target-ms 20 --time-limit 520 --quiet --out "$OUT/fa2" > "$OUT/fa2.log" 2>&1
    echo "bench exit $?" >> "$OUT/fa2.log"
    tarred fa2; summary "$OUT/fa2.log" 40
    ;;
linear)  # issues 5 and 6: the linear sweep through the harness, and the kernel benchmark with FLA
    setup
    timeout 130 python3 -m harness bench --preset linear-sweep --dtypes bf16 \
        --backends fla_chunk,fla_fused_chunk,triton_la_chunk --modes fwd,fwd+bwd \
        --target-ms 15 --time-limit 110 --quiet --out "$OUT/lin" > "$OUT/lin.log" 2>&1
    echo "bench exit $?" >> "$OUT/lin.log"
    tarred lin
    linear_kernels 250 230
    summary "$OUT/lin.log" 25; summary "$OUT/la.log" 45
    ;;
linear-graphs)  # issues 5 and 6: the linear sweep through the harness, device time (CUDA graphs):
    # `linear-graphs DTYPES [CASES-REGEX] [BACKENDS] [SECONDS]`, e.g. `linear-graphs fp16,bf16 K64V64 fla_fused_chunk,triton_la_chunk 330`
    setup
    dt=$(echo "${2:-bf16}" | tr , -)
    secs=${5:-540}
    timeout $((secs + 35)) python3 -m harness bench --preset linear-sweep --dtypes "${2:-bf16}" --cases "${3:-.}" \
        --backends "${4:-fla_chunk,fla_fused_chunk,triton_la_chunk}" --baseline fla_chunk,fla_fused_chunk \
        --modes fwd,fwd+bwd --cuda-graphs \
        --target-ms 15 --time-limit "$secs" --quiet --out "$OUT/lin-$dt" > "$OUT/lin-$dt.log" 2>&1
    echo "bench exit $?" >> "$OUT/lin-$dt.log"
    cp "$OUT/lin-$dt/report.md" "$OUT/report-$dt.md" 2>/dev/null
    tarred "lin-$dt"
    summary "$OUT/lin-$dt.log" 8
    grep -E "^### B4|^\| (fla_|triton_la)" "$OUT/report-$dt.md" | cut -d'|' -f2,3,5 | cut -c1-150
    ;;
linear-kernels)  # issue 5 alone: `linear-kernels 64` or `linear-kernels 128`, fp16 + bf16, T 1k-16k, with FLA
    setup
    linear_kernels 570 540 "${2:-64}"
    summary "$OUT/la.log" 40
    ;;
accept-fa4)  # issue 8: flash-attn-4 accepted (bf16, with the speed section), alone
    setup
    accept harness.accept.shims:flash_attn_cute 345
    summary "$OUT/acc-flash_attn_cute.log" 12
    ;;
accept-pair)  # issue 15: `accept-pair IMPL SECONDS`: this tree's accept, then the one in .old (carried: an
    # earlier commit's harness/ and kernels/, `git archive REV harness kernels | tar -x -C .old`), same machine
    setup
    accept "$2" "$3"
    [ -d .old/harness ] && accept "$2" "$3" .old
    for f in "$OUT"/acc-*.log; do summary "$f" 4; done
    ;;
audit-measure)  # issue 20 (committed as docs/claims/audit-h100): the FA3 chart measured here (FA2 -> sdpa_flash, cuDNN, FA3 -> flash-attn-4, standard -> eager);
    # the other two tables (RTX 5090, RTX 4060 Laptop) get ordering checks. Needs flash-attn-4 installed (fa4-0 to
    # fa4-N, .fa4-in).
    setup
    timeout 540 python3 -m harness audit docs/claims/*.csv --measure --out "$OUT/audit" > "$OUT/audit.log" 2>&1
    echo "audit exit $?" >> "$OUT/audit.log"
    tarred audit
    summary "$OUT/audit.log" 30
    ;;
fuzz-shrink)  # issue 17: the three known defects shrunk to standalone repros, then the fuzzer on every installed
    # backend. Needs flash-attn-4 (fa4-0 to fa4-N, .fa4-in) and fla (.whl). Cases: harness/check/known_issues.py.
    setup
    mkdir -p "$OUT/shrink"
    timeout 150 python3 -m harness shrink --backend sdpa_cudnn --case 'B1-H4/1-S70x33-D16-causal-bf16' --seed 0 \
        --out "$OUT/shrink/cudnn" > "$OUT/shrink/cudnn.log" 2>&1
    timeout 150 python3 -m harness shrink --backend flash_attn_cute --case 'B1-H4/1-S70x33-D16-causal-bf16' --seed 0 \
        --out "$OUT/shrink/fa4" > "$OUT/shrink/fa4.log" 2>&1
    ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 150 python3 -m harness shrink --backend fla_fused_chunk \
        --case 'B1-H2-T63-K32V32-g(n=0.1)-h0-dhT-bf16' --seed 0 --out "$OUT/shrink/fla" > "$OUT/shrink/fla.log" 2>&1
    timeout 200 python3 -m harness fuzz --backends sdpa_flash,sdpa_cudnn,sdpa_efficient,flash_attn_cute,triton_fa \
        --dtypes bf16,fp16 --budget 100s --seed 1 --out "$OUT/fuzz" > "$OUT/fuzz.log" 2>&1
    echo "fuzz exit $?" >> "$OUT/fuzz.log"
    rm -rf "$OUT"/shrink/*/work "$OUT"/fuzz/work  # the exchanged tensors: too large to come back (session 9 lost a run)
    (cd "$OUT" && tar czf shrink.tgz shrink fuzz && rm -rf shrink fuzz)
    tail -n 12 "$OUT"/fuzz.log; grep -h "minimal\|needed\|dropped\|repro" "$OUT"/shrink/*.log 2>/dev/null || true
    ;;
fuzz-10m)  # issue 17: `fuzz-10m A` then `fuzz-10m B` (different seeds): every installed backend of each family
    # (`--backends all`) in bf16 and fp16, the three families side by side on the GPU, 290 s each per call: two
    # calls make the issue's 10 minutes. Needs flash-attn-4 (fa4-0 to fa4-N, .fa4-in) and fla (.whl).
    # `fuzz-10m B SHRINK-ARGS...`: after the fuzz, one `harness shrink` with those arguments (150 s).
    setup
    part=${2:?usage: fuzz-10m A|B [shrink args]}; shift 2
    seed=$([ "$part" = A ] && echo 101 || echo 202)
    d="fuzz-$part"; mkdir -p "$OUT/$d"
    for fam in softmax linear decode; do
        ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 330 python3 -m harness fuzz --backends all --family "$fam" \
            --dtypes bf16,fp16 --budget 290s --timeout 90 --seed "$seed" --out "$OUT/$d/$fam" \
            > "$OUT/$d/$fam.log" 2>&1 &
    done
    wait
    if [ $# -gt 0 ]; then
        timeout 150 python3 -m harness shrink "$@" --out "$OUT/$d/shrink" > "$OUT/$d/shrink.log" 2>&1
        echo "shrink exit $?" >> "$OUT/$d/shrink.log"
    fi
    rm -rf "$OUT/$d"/*/work "$OUT/$d"/shrink/work  # the exchanged tensors: too large to come back
    tarred "$d"
    (cd "$OUT" && tar xzf "$d.tgz" && for f in "$d"/*.log; do echo "---- $f"; grep -v "it/s\|case/s" "$f" | tail -n 14; done; rm -rf "$d")
    ;;
triage)  # issue 17: session 10's fuzz findings, side by side: each shrunk (the shrinker now stops short of
    # another recorded defect), the in-repo linear forward's fault probed per launch config, torch SDPA's
    # forward determinism per backend. Needs flash-attn-4 (fa4-0 to fa4-N, .fa4-in) and fla (.whl).
    setup
    d="$OUT/triage"; mkdir -p "$d"
    shr() { shrink_case "$d" "$@"; }
    shr fa4-d80 flash_attn_cute 'B2-H4/1-S119x2031-D80-causal-fp16' 1000004 &
    shr fa4-d48cap flash_attn_cute 'B4-H32/2-S183x17-D48-cap50-bf16' 101000308 &
    shr fa4-varlen flash_attn_cute 'B2-H2/1-varlen[7x33,1947x97]-D80-causal-scale1-offset-fp16' 101000305 &
    shr cudnn-win sdpa_cudnn 'B1-H3-S359x15-D128-win0x8-bf16' 202000609 &
    shr fla-gamma fla_fused_chunk 'B2-H1-T65-K32V128-g_gamma(n=0.1)-h0-dhT-fp16' 202000614 --family linear &
    shr fa4dec-win flash_attn_cute_decode 'B4-H3-Q1-L1490-P16-D32v96-win650x0-cap30-scale1-bf16' 202000633 --family decode &
    shr fa4dec-d16 flash_attn_cute_decode 'B2-H8/1-Q2-L1709r-contig-new-D16v128-bf16' 101000313 --family decode &
    timeout 300 python3 benchmarks/la_crash_probe.py --jobs 6 > "$d/la_probe.log" 2>&1
    timeout 120 python3 benchmarks/sdpa_determinism_probe.py > "$d/sdpa_det.log" 2>&1
    wait
    rm -rf "$d"/*/work
    tarred triage
    (cd "$OUT" && tar xzf triage.tgz && for f in triage/*.log; do echo "---- $f"; grep -E "^minimal|^  [a-zA-Z].*: (dropped|needed)|^repro|exit|failed|^  K|max \||refused" "$f" | tail -n 16; done; rm -rf triage)
    ;;
triage2)  # issue 17: the findings shrunk again with the shrinker's severity rule (a smaller case must fail
    # >= 10x its bound), each repro script run once (exit 1 = the defect reproduced), and the in-repo linear
    # backward's fault probed per config and plan. Needs flash-attn-4 (fa4-0 to fa4-N, .fa4-in) and fla (.whl).
    setup
    d="$OUT/triage2"; mkdir -p "$d"
    shr() { shrink_case "$d" "$@"; }
    shr fa4-d48 flash_attn_cute 'B4-H32/2-S183x17-D48-cap50-bf16' 101000308 &
    shr fa4-d80 flash_attn_cute 'B2-H4/1-S119x2031-D80-causal-fp16' 1000004 &
    shr fa4-d16 flash_attn_cute 'B1-H4/1-S70x33-D16-causal-bf16' 0 &
    shr cudnn-win sdpa_cudnn 'B1-H3-S359x15-D128-win0x8-bf16' 202000609 &
    shr fla-gamma fla_fused_chunk 'B2-H1-T65-K32V128-g_gamma(n=0.1)-h0-dhT-fp16' 202000614 --family linear &
    shr fa4dec flash_attn_cute_decode 'B4-H3-Q1-L1490-P16-D32v96-win650x0-cap30-scale1-bf16' 202000633 --family decode &
    timeout 300 python3 benchmarks/la_crash_probe.py --what bwd --jobs 6 > "$d/la_probe.log" 2>&1
    wait
    rm -rf "$d"/*/work
    tarred triage2
    (cd "$OUT" && tar xzf triage2.tgz && for f in triage2/*.log; do echo "---- $f"; grep -E "^minimal|^  [a-zA-Z].*: (dropped|needed)|^repro|exit|failed$|FAIL" "$f" | tail -n 14; done; rm -rf triage2)
    ;;
la-fix)  # issue 17: the in-repo linear backward without 1-stage configs (session 10's fault): the probe (1-stage
    # configs still tried explicitly, each launch 3 times), the kernel's GPU tests (new: K != V through every
    # backward config), and its time at D 64 / 128 (bf16, g_gamma). Needs fla (.whl) for the FLA comparison test.
    setup
    d="$OUT/la-fix"; mkdir -p "$d"
    timeout 200 python3 benchmarks/la_crash_probe.py --what bwd --repeat 3 --jobs 8 > "$d/la_probe.log" 2>&1
    ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_linear_attn.py \
        -p no:cacheprovider > "$d/la_tests.log" 2>&1
    echo "pytest exit $?" >> "$d/la_tests.log"
    timeout 150 python3 benchmarks/bench_linear_attn.py --dims 64 128 --T 4096 16384 --dtypes bf16 --gate gamma \
        --skip-check --backends ours --time-budget 120 > "$d/la_bench.log" 2>&1
    tarred la-fix
    (cd "$OUT" && tar xzf la-fix.tgz && grep -E "launches failed|^  K" la-fix/la_probe.log | head -20; \
     tail -n 4 la-fix/la_tests.log; tail -n 14 la-fix/la_bench.log; rm -rf la-fix)
    ;;
main-job)  # issue 21: `python -m harness run` with no options (MAIN_JOB_ARGS adds some), cold (empty Triton /
    # inductor / flash-attn-4 caches), then warm
    setup
    export TRITON_CACHE_DIR=/tmp/mj-triton TORCHINDUCTOR_CACHE_DIR=/tmp/mj-inductor FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/mj-fa4
    rm -rf /tmp/mj-triton /tmp/mj-inductor /tmp/mj-fa4
    for run in cold warm; do
        start=$(date +%s)
        timeout 280 python3 -m harness run ${MAIN_JOB_ARGS:-} --out "$OUT/run-$run" > "$OUT/run-$run.log" 2>&1
        echo "main job $run: exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/run-$run.log"
        tarred "run-$run"
    done
    for run in cold warm; do grep -E "workers|^main job|time per backend" -A 12 "$OUT/run-$run.log" | head -n 30; done
    ;;
decode)  # issue 18: the decode kernel's GPU tests, then every decode backend on the real models' decode steps:
    # correctness against the FP64 oracle (cache written bit for bit), then the forward timed, GB/s against
    # decode_bytes and the card's copy rate. flash-attn-4 is the peer when installed (fa4-0 to fa4-N, .fa4-in).
    setup
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_kernel.py tests/check/test_decode.py \
        > "$OUT/decode-tests.log" 2>&1
    echo "decode tests exit $?" >> "$OUT/decode-tests.log"
    # CUDA graphs: a serving stack replays its decode step from one; without, every backend here is
    # host-bound (150-900 us of host time per call, against 50-500 us of device time)
    # DECODE_CASES: a regex of case ids (default: all 19), to re-run part of the preset; DECODE_BACKENDS: a
    # comma-separated subset of the backends
    timeout 420 python3 -m harness bench --preset decode --modes fwd --no-plots --cuda-graphs --cases "${DECODE_CASES:-.}" \
        --backends "${DECODE_BACKENDS:-decode_sdpa,flash_attn_cute_decode,flash_attn_kvcache,flash_attn3_kvcache,flex_decode,triton_decode}" \
        --out "$OUT/decode-bench" > "$OUT/decode-bench.log" 2>&1
    echo "decode bench exit $?" >> "$OUT/decode-bench.log"
    summary "$OUT/decode-tests.log" 5
    summary "$OUT/decode-bench.log" 4
    grep -A 8 "GB/s by cache length" "$OUT/decode-bench/report.md" | head -n 90
    tarred decode-bench
    ;;
layers)  # issue 16: `layers attention-layers [REGEX]` or `layers models [REGEX]`: every fast backend and the
    # in-repo kernel on the seeds' attention-layer configurations (with layer-mha-refs, the MHA twins of its
    # D64 GQA/MQA rows) / real models' shapes, forward and backward, device time (CUDA graphs), one run;
    # then benchmarks/layer_table.py. flash-attn-4 installed first (fa4-0 to fa4-N, .fa4-in).
    setup
    p=${2:-attention-layers}
    presets=$p
    [ "$p" = attention-layers ] && presets=attention-layers,layer-mha-refs
    name=$p${3:+-part}
    # expandable segments: the wide cases leave the caching allocator fragmented (session 12: 71 GiB reserved
    # but unallocated, a 4 GiB allocation of the 2112 / 2048 case failed)
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 570 python3 -m harness bench --preset "$presets" \
        ${3:+--cases "$3"} --modes fwd,bwd --no-plots \
        --no-memory --cuda-graphs --target-ms 20 --time-limit 520 --quiet \
        --backends sdpa_flash,sdpa_cudnn,sdpa_efficient,flash_attn_cute,triton_fa --out "$OUT/$name" \
        > "$OUT/$name.log" 2>&1
    echo "bench $p exit $?" >> "$OUT/$name.log"
    python3 benchmarks/layer_table.py "$OUT/$name/results.json" --out "$OUT/$name/table.md" | cut -c1-400 | tail -n 40
    tail -n 3 "$OUT/$name.log"
    tarred "$name"
    ;;
launch-check)  # issue 16 (session 12): replayed launches on the GPU: the kernel tests (pinned configs), then
    # host_overhead.py (FLA from .whl if carried) and a cProfile of one in-repo backward and forward
    setup
    mkdir -p "$OUT/launch"
    FLASH_ATTN_AUTOTUNE=0 KERNELS_LINEAR_ATTN_AUTOTUNE=0 timeout 300 python3 -m pytest -q -x -n 8 \
        tests/kernels/test_launcher.py tests/kernels/test_flash_attn.py tests/kernels/test_linear_attn.py \
        > "$OUT/launch/tests.log" 2>&1
    echo "kernel tests exit $?" >> "$OUT/launch/tests.log"
    ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 240 python3 benchmarks/host_overhead.py --out "$OUT/launch/overhead" \
        > "$OUT/launch/overhead.log" 2>&1
    echo "overhead exit $?" >> "$OUT/launch/overhead.log"
    for m in fwd bwd; do
        timeout 60 python3 benchmarks/host_profile.py triton_fa B2-H16/1-S2048x2048-D64-bf16 --mode $m --top 30 \
            > "$OUT/launch/profile-$m.log" 2>&1
    done
    summary "$OUT/launch/tests.log" 4
    grep -h "us of host time" "$OUT/launch"/profile-*.log
    cat "$OUT/launch/overhead/overhead.md"
    tarred launch
    ;;
host-ab)  # issue 16: host time of this tree's kernels against earlier commits', on one host in one call
    # (carry .old and/or .old-REV, each made by `mkdir -p .old && git archive REV kernels | tar -x -C .old`, and
    # .whl): this tree's harness/ and benchmarks/ measure every tree (each old kernels/ beside them in
    # /tmp/ab-NAME), runs alternating new, old trees, HOST_AB_PAIRS times (default 2), pinned configs (the launch
    # path does not depend on the tile), then host_ab.py's table. The backward cases run the default route
    # (deterministic: split); FLASH_ATTN_BWD=fused in the environment puts every tree's on the fused route.
    # HOST_AB_BACKENDS / HOST_AB_CASES / HOST_AB_MODES narrow each run (host_overhead.py's --backends / --cases /
    # --modes; defaults: the three in-repo kernels, its cases, both modes)
    setup
    trees=""
    for d in .old .old-*; do
        [ -d "$d/kernels" ] || continue
        name=${d#.}; trees="$trees $name"
        rm -rf "/tmp/ab-$name" && mkdir -p "/tmp/ab-$name" && cp -r harness benchmarks "/tmp/ab-$name/" && cp -r "$d/kernels" "/tmp/ab-$name/"
    done
    mkdir -p "$OUT/host-ab"
    start=$SECONDS
    for i in $(seq 1 "${HOST_AB_PAIRS:-2}"); do
        for side in new $trees; do
            # no run started past 400 s: the step must end (and tar) inside the device call's 600 s
            if [ $((SECONDS - start)) -gt 400 ]; then echo "host-ab: $side-$i not started (time)"; continue; fi
            root=$PWD; [ "$side" = new ] || root=/tmp/ab-$side
            (cd "$root" && FLASH_ATTN_AUTOTUNE=0 KERNELS_LINEAR_ATTN_AUTOTUNE=0 timeout 150 python3 benchmarks/host_overhead.py \
                --backends "${HOST_AB_BACKENDS:-triton_fa,triton_la_chunk,triton_decode}" \
                ${HOST_AB_CASES:+--cases "$HOST_AB_CASES"} ${HOST_AB_MODES:+--modes "$HOST_AB_MODES"} \
                --out "$OUT/host-ab/$side-$i") > "$OUT/host-ab/$side-$i.log" 2>&1
            echo "$side-$i exit $?" >> "$OUT/host-ab/$side-$i.log"
        done
    done
    python3 benchmarks/host_ab.py "$OUT/host-ab" | tee "$OUT/host-ab/ab.md"
    tarred host-ab
    ;;
route-ab)  # issue 16: the in-repo backward through the harness with this tree's kernels against .old's (carried:
    # `mkdir .old && git archive REV harness kernels | tar -x -C .old`; this tree's harness drives both), alternating
    # new, old, new, old: a route change's whole-backward effect on the same host in one call (AB_CASES: a case regex
    # of the preset AB_PRESET, default fa-sweep; AB_MODES, default bwd; AB_BACKENDS, default triton_fa
    # (triton_fa_det: the deterministic call, the kernel's default); AB_SECONDS a run, default 90; AB_PAIRS, default
    # 2; AB_TAG: the output folder's suffix, for two A/Bs in one call; the first
    # pair's runs compile each tree's kernels: AB_FIRST_EXTRA more seconds, default 60 — session 40's first run hit
    # its limit while compiling and lost a cell; AB_TESTS: a -k expression of test_bwd_gluon.py's GPU tests run
    # first with this tree, 150 s at most, e.g. "heavy" after a kernel change (AB_TEST_FILES: other test files,
    # space-separated, e.g. "tests/kernels/test_bwd_gluon.py tests/kernels/test_gluon_ws.py"); AB_GRAPHS=1: device
    # time, CUDA graphs replayed, for calls whose host path is longer than their kernels: session 48's 1k pairs
    # scattered 0.66-2.32x without; AB_IDS: case ids of no preset (harness bench --case), run alone unless AB_PRESET is set too)
    setup
    rm -rf /tmp/ab-old && mkdir -p /tmp/ab-old && cp -r harness /tmp/ab-old/ && cp -r .old/kernels /tmp/ab-old/
    ab="$OUT/route-ab${AB_TAG:+-$AB_TAG}"
    mkdir -p "$ab"
    sel=(--preset "${AB_PRESET:-fa-sweep}")
    if [ -n "${AB_IDS:-}" ]; then sel=(--case "$AB_IDS"); [ -n "${AB_PRESET:-}" ] && sel+=(--preset "$AB_PRESET"); fi
    cases=${AB_CASES:-}; [ -z "$cases" ] && [ -n "${AB_IDS:-}" ] && cases=.
    : "${cases:?AB_CASES (a case regex; optional with AB_IDS)}"
    if [ -n "${AB_TESTS:-}" ]; then
        TEST_FILES=${AB_TEST_FILES:-} bwd_gluon_tests "route-ab${AB_TAG:+-$AB_TAG}" "$AB_TESTS" 150
        tail -n 3 "$ab/tests.log"
    fi
    for i in $(seq 1 "${AB_PAIRS:-2}"); do
        for side in new old; do
            root=$PWD; [ "$side" = new ] || root=/tmp/ab-old
            limit=${AB_SECONDS:-90}; [ "$i" = 1 ] && limit=$(( limit + ${AB_FIRST_EXTRA:-60} ))
            (cd "$root" && PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$root \
                timeout $(( limit + 30 )) python3 -m harness bench "${sel[@]}" --dtypes bf16 \
                --backends "${AB_BACKENDS:-triton_fa}" --modes "${AB_MODES:-bwd}" --cases="$cases" \
                ${AB_GRAPHS:+--cuda-graphs --no-memory --no-plots} --target-ms 25 --time-limit "$limit" --quiet \
                --out "$ab/$side-$i") \
                > "$ab/$side-$i.log" 2>&1
            echo "$side-$i exit $?" >> "$ab/$side-$i.log"
            grep -A8 "^### " "$ab/$side-$i.log" | grep -E "^###|triton_fa" | sed "s/^/$side-$i /"
            # the table so far after every run: a call cut short (its timeout, the budget) still returns the pairs
            # it finished (session 53 lost a whole A/B's table to a `timeout` around route-ab)
            python3 benchmarks/route_ab.py "$ab" > "$ab/ab.md" 2> /dev/null || true
        done
    done
    python3 benchmarks/route_ab.py "$ab" | tee "$ab/ab.md"
    tarred "route-ab${AB_TAG:+-$AB_TAG}"
    ;;
host-floors)  # issue 16: the in-repo kernels' launch paths beside their launches alone and the host's floors
    # (one torch.empty, one replayed one-pointer launch), unpinned and pinned to one core (HOST_PIN, default 3),
    # ABBA, pinned configs; host_ab.py's table of the four runs
    setup
    mkdir -p "$OUT/host-floors"
    start=$SECONDS
    for run in free-1 pin-1 pin-2 free-2; do
        if [ $((SECONDS - start)) -gt 300 ]; then echo "host-floors: $run not started (time)"; continue; fi
        pin=""; [ "${run%-*}" = pin ] && pin="--pin-cpu ${HOST_PIN:-3}"
        FLASH_ATTN_AUTOTUNE=0 KERNELS_LINEAR_ATTN_AUTOTUNE=0 timeout 120 python3 benchmarks/host_overhead.py $pin \
            --backends ${HOST_BACKENDS:-triton_fa,triton_la_chunk} --out "$OUT/host-floors/$run" > "$OUT/host-floors/$run.log" 2>&1
        echo "$run exit $?" >> "$OUT/host-floors/$run.log"
        grep "host floor" "$OUT/host-floors/$run.log"
    done
    python3 benchmarks/host_ab.py "$OUT/host-floors" | tee "$OUT/host-floors/table.md"
    tarred host-floors
    ;;
overhead)  # issue 16: host microseconds per call against the kernels' device time (CUDA graphs), in-repo
    # kernels and peers (flash-attn-4 and FLA installed first: fa4-0 to fa4-N, then carry .fa4-in and .whl)
    setup
    timeout 400 python3 benchmarks/host_overhead.py --out "$OUT/overhead" > "$OUT/overhead.log" 2>&1
    echo "overhead exit $?" >> "$OUT/overhead.log"
    cat "$OUT/overhead/overhead.md"
    ;;
accept-decode)  # issue 18: the in-repo decode kernel and flash-attn-4's paged path accepted under `inference`
    # (--family decode, bf16, with the speed section). flash-attn-4 installed first (fa4-0 to fa4-N, .fa4-in).
    setup
    cat > /tmp/triton_decode_impl.py <<'PY'
from kernels.decode import decode_attention


def attn(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
         window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    return decode_attention(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
                            causal=causal, window_size=window_size, softmax_scale=softmax_scale, softcap=softcap,
                            return_lse=True)
PY
    cp /tmp/triton_decode_impl.py ./triton_decode_impl.py
    # ACCEPT_IMPLS: which of the two (default both; flash-attn-4's needs it installed)
    for impl in ${ACCEPT_IMPLS:-triton_decode_impl:attn harness.accept.shims:flash_attn_cute_decode}; do
        name=accd-${impl##*:}
        timeout 270 python3 -m harness accept --impl "$impl" --family decode --profile inference --device cuda \
            --dtypes bf16 --jobs 4 --timeout 200 --out "$OUT/$name" > "$OUT/$name.log" 2>&1
        echo "accept $impl exit $?" >> "$OUT/$name.log"
        tarred "$name"
        summary "$OUT/$name.log" 14
    done
    rm -f triton_decode_impl.py
    ;;
trust-gpu)  # issue 15: the parent's clock on the GPU (a patched timer flagged, an honest one not)
    setup
    timeout 300 python3 -m pytest -q -p no:cacheprovider -s tests/accept/test_trust_gpu.py > "$OUT/trust.log" 2>&1
    echo "trust-gpu exit $?" >> "$OUT/trust.log"
    summary "$OUT/trust.log" 12
    ;;
gate)  # issue 7's gate alone
    setup
    gate
    for f in "$OUT"/gate.tgz; do tar xzf "$f" -O --wildcards '*.log' | grep -E "exit|passed|failed|regressed" ; done
    ;;
gate-linear)  # issue 7's gate, then the linear kernel benchmark with FLA (issue 5), in one call
    setup
    gate
    linear_kernels 230 210
    summary "$OUT/la.log" 45
    ;;
multi-gpu)  # issue 7 on a host with several GPUs: gpu-tests and bench on all GPUs, then on GPU 0 alone
    setup
    dt=${2:-fp16}
    nvidia-smi -L
    for run in all one; do
        [ "$run" = one ] && export CUDA_VISIBLE_DEVICES=0
        # both runs start cold: a second run would otherwise reuse the first one's compiles
        export TRITON_CACHE_DIR=/tmp/mg-cache-$run/triton TORCHINDUCTOR_CACHE_DIR=/tmp/mg-cache-$run/inductor
        start=$(date +%s)
        timeout -s INT 250 python3 -m nox --no-venv -s "gpu-tests(dtype='$dt', arch='sm90')" > "$OUT/mg-tests-$run.log" 2>&1
        echo "gpu-tests on $run GPU(s): exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/mg-tests-$run.log"
        rm -rf "reports/mg-$run" && mv "reports/gpu-tests-sm90-$dt" "reports/mg-$run"
        rm -rf .benchmarks; start=$(date +%s)
        timeout 100 python3 -m nox --no-venv -s bench -- --attn-backends sdpa_flash,sdpa_cudnn --attn-preset configs \
            --attn-dtypes bf16 > "$OUT/mg-bench-$run.log" 2>&1
        echo "bench on $run GPU(s): exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/mg-bench-$run.log"
        cp -r .benchmarks "reports/mg-$run/benchmarks" 2>/dev/null
    done
    unset CUDA_VISIBLE_DEVICES TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR
    (cd reports && tar czf "$OUT/mg-logs.tgz" mg-all mg-one)
    for phase in correctness timing; do
        echo "== $phase: all GPUs vs GPU 0 alone"
        python3 -m harness.result_log --compare "reports/mg-all/$phase.jsonl" "reports/mg-one/$phase.jsonl" | head -n 20
    done
    grep -hE "passed|failed|shard|merged" "$OUT"/mg-bench-*.log | tail -n 8
    ;;
new-gpu)  # session 7's changes on the GPU, in one short call: the flash kernels' d_v != d and group-split
    # backward (FLASH_ATTN_AUTOTUNE=0: pinned configs), the decode kernel's and adapters' tests (flex_decode
    # compiled when flash-attn-4 is not needed), the timer's failed-capture test, the FP8 cases' CPU-side
    # checks on the GPU's torch. Then the MQA/GQA backward the group split is for, against cuDNN and FA2.
    setup
    FLASH_ATTN_AUTOTUNE=0 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_flash_attn.py \
        tests/kernels/test_decode_kernel.py tests/check/test_decode.py tests/perf/test_timing.py \
        "tests/check/test_verify.py::test_fp8_reference_and_a_flash_style_fp8_kernel_pass" > "$OUT/new-gpu.log" 2>&1
    echo "new-gpu tests exit $?" >> "$OUT/new-gpu.log"
    timeout 240 python3 -m harness bench --preset attention-layers --modes fwd,bwd --no-plots \
        --cases 'H16/1|H32/1|H40/1|H32/8|D192' --backends sdpa_flash,sdpa_cudnn,triton_fa \
        --time-limit 220 --out "$OUT/mqa-bwd" > "$OUT/mqa-bwd.log" 2>&1
    echo "bench exit $?" >> "$OUT/mqa-bwd.log"
    summary "$OUT/new-gpu.log" 8
    grep -A 6 "^### B" "$OUT/mqa-bwd/report.md" | grep -v "^--" | cut -c1-160 | head -n 60
    tarred mqa-bwd
    ;;
cudnn-fp8)  # issue 19: cuDNN's FP8 SDPA adapter (harness/adapters/cudnn_fp8.py, written in session 10, never run
    # on a GPU before this step): nvidia-cudnn-frontend from .whl-cudnn (carry it), the adapter against the
    # FP64 oracle on the small FP8 preset beside the in-repo FP8 kernel and the eager reference, then the
    # FP8 sweep's forward for both (the bf16 kernels of the same run as the baseline).
    setup
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-cudnn/*.whl > /dev/null 2>&1
    python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1
    timeout 200 python3 -m harness run --backends cudnn_fp8,triton_fa_fp8,eager_fp8 --preset small-fp8 \
        --dtypes bf16,fp16 --out "$OUT/cudnn-fp8-run" > "$OUT/cudnn-fp8-run.log" 2>&1
    echo "run exit $?" >> "$OUT/cudnn-fp8-run.log"
    timeout 300 python3 -m harness bench --preset fp8-sweep --modes fwd --no-plots --time-limit 270 \
        --backends cudnn_fp8,triton_fa_fp8,sdpa_cudnn,triton_fa --out "$OUT/cudnn-fp8-bench" > "$OUT/cudnn-fp8-bench.log" 2>&1
    echo "bench exit $?" >> "$OUT/cudnn-fp8-bench.log"
    tail -n 25 "$OUT/cudnn-fp8-run.log"
    grep -A 8 "TFLOP/s by" "$OUT/cudnn-fp8-bench/report.md" | head -n 60
    tarred cudnn-fp8-run; tarred cudnn-fp8-bench
    ;;
fp8-bwd)  # issue 19, session 19: cuDNN's FP8 backward (sdpa_fp8_backward; carry .whl-cudnn): the probe checks it
    # against the FP64 oracle on small cases and compares cuDNN's amax of dS with the harness's (the dS
    # convention), then the fp8-bwd preset's forward and backward beside the bf16 kernels of the same run.
    setup
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-cudnn/*.whl > /dev/null 2>&1
    if [ "${FP8_BWD_PROBE:-1}" != 0 ]; then  # FP8_BWD_PROBE=0: the bench alone
        timeout 200 python3 benchmarks/cudnn_fp8_bwd_probe.py ${FP8_BWD_PROBE_CASES:+--cases $FP8_BWD_PROBE_CASES} \
            > "$OUT/fp8-bwd-probe.log" 2>&1
        echo "probe exit $?" >> "$OUT/fp8-bwd-probe.log"
        tail -n 14 "$OUT/fp8-bwd-probe.log"
    fi
    timeout "${FP8_BWD_SECONDS:-330}" python3 -m harness bench --preset fp8-bwd --modes fwd,bwd --no-plots \
        --time-limit $(( ${FP8_BWD_SECONDS:-330} - 30 )) --backends cudnn_fp8,triton_fa_fp8,sdpa_cudnn,triton_fa \
        --cases "${FP8_BWD_CASES:-S(1024|4096|8192)x}" --out "$OUT/fp8-bwd-bench" > "$OUT/fp8-bwd-bench.log" 2>&1
    echo "bench exit $?" >> "$OUT/fp8-bwd-bench.log"
    tail -n 4 "$OUT/fp8-bwd-bench.log"
    sed -n '/^## Per case/,$p' "$OUT/fp8-bwd-bench/report.md" | grep -v "^$" | head -n 100
    cp "$OUT/fp8-bwd-probe.log" "$OUT/fp8-bwd-bench/" 2>/dev/null; tarred fp8-bwd-bench
    ;;
fp8-bwd-ours)  # issue 19, session 21: the in-repo FP8 backward (flash_attn_fp8_bwd_func) on the GPU, no peer
    # installed: the flash kernels' GPU tests with pinned configs (the bf16 / fp16 / fp32 backward shares its
    # kernels), the small FP8 preset through the harness with the eager reference, then the fp8-bwd preset's
    # backward beside the in-repo bf16 kernel and torch's cuDNN SDPA (FP8_BWD_CASES, FP8_BWD_SECONDS;
    # FP8_BWD_PRESET=fp8-bwd-hd64 for hd 64).
    # `FP8_BWD_TESTS=0` skips the tests. The cuDNN FP8 peer: the `fp8-bwd` step (carry .whl-cudnn).
    setup
    if [ "${FP8_BWD_TESTS:-1}" != 0 ]; then
        FLASH_ATTN_AUTOTUNE=0 timeout 260 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_flash_attn.py \
            tests/kernels/test_launcher.py > "$OUT/fp8-bwd-tests.log" 2>&1
        echo "tests exit $?" >> "$OUT/fp8-bwd-tests.log"
        grep -E "^(FAILED|ERROR)" "$OUT/fp8-bwd-tests.log" | head -n 20; tail -n 2 "$OUT/fp8-bwd-tests.log"
    fi
    timeout 120 python3 -m harness run --backends triton_fa_fp8,eager_fp8 --preset small-fp8 --dtypes bf16 \
        --out "$OUT/fp8-bwd-run" > "$OUT/fp8-bwd-run.log" 2>&1
    echo "run exit $?" >> "$OUT/fp8-bwd-run.log"
    grep -E "triton_fa_fp8" "$OUT/fp8-bwd-run.log" | grep -v " pass " | head -n 20; tail -n 3 "$OUT/fp8-bwd-run.log"
    if [ "${FP8_BWD_SECONDS:-0}" != 0 ]; then
        timeout "$FP8_BWD_SECONDS" python3 -m harness bench --preset "${FP8_BWD_PRESET:-fp8-bwd}" --modes bwd --no-plots \
            --time-limit $(( FP8_BWD_SECONDS - 20 )) --backends triton_fa_fp8,triton_fa,sdpa_cudnn \
            --cases "${FP8_BWD_CASES:-S(4096|8192)x}" --out "$OUT/fp8-bwd-ours" > "$OUT/fp8-bwd-ours.log" 2>&1
        echo "bench exit $?" >> "$OUT/fp8-bwd-ours.log"
        tail -n 4 "$OUT/fp8-bwd-ours.log"
        sed -n '/^## Per case/,$p' "$OUT/fp8-bwd-ours/report.md" | grep -v "^$" | head -n 60
        tarred fp8-bwd-ours
    fi
    cp "$OUT/fp8-bwd-tests.log" "$OUT/fp8-bwd-run/" 2>/dev/null; tarred fp8-bwd-run
    ;;
fp8-out)  # issue 19, session 18: FP8 output (e4m3 in V's units, read back by the harness outside the timed
    # call) in the in-repo kernels and cuDNN's FP8 graphs with top-left masks on sm90 (carry .whl-cudnn):
    # the GPU tests of the FP8 paths, both backends against the FP64 oracle on the small FP8 preset, then
    # the FP8 sweep's -o8- cells (FP8 out on both sides: what cuDNN 9.19 builds on sm90) at 4k and 16k.
    setup
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-cudnn/*.whl > /dev/null 2>&1
    python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1
    FLASH_ATTN_AUTOTUNE=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_gluon.py \
        tests/kernels/test_flash_attn.py -k "fp8 or gluon" > "$OUT/fp8-out-tests.log" 2>&1
    echo "tests exit $?" >> "$OUT/fp8-out-tests.log"
    timeout 150 python3 -m harness run --backends cudnn_fp8,triton_fa_fp8,eager_fp8 --preset small-fp8 \
        --dtypes bf16 --out "$OUT/fp8-out-run" > "$OUT/fp8-out-run.log" 2>&1
    echo "run exit $?" >> "$OUT/fp8-out-run.log"
    timeout "${SWEEP_SECONDS:-330}" python3 -m harness bench --preset fp8-sweep --modes fwd --no-plots \
        --time-limit $(( ${SWEEP_SECONDS:-330} - 20 )) --backends triton_fa_fp8,cudnn_fp8 \
        --cases "${SWEEP_CASES:-S(4096|16384)x.*-e4m3-o8-bf16\$}" --out "$OUT/fp8-out-sweep" > "$OUT/fp8-out-sweep.log" 2>&1
    echo "bench exit $?" >> "$OUT/fp8-out-sweep.log"
    tail -n 4 "$OUT/fp8-out-tests.log"
    grep -E "cudnn_fp8|triton_fa_fp8" "$OUT/fp8-out-run.log" | grep -v " pass " | head -n 20
    tail -n 3 "$OUT/fp8-out-run.log"
    grep -A 8 "TFLOP/s" "$OUT/fp8-out-sweep/report.md" | head -n 80
    tail -n 2 "$OUT/fp8-out-sweep.log"
    tarred fp8-out-run; tarred fp8-out-sweep
    ;;
fp8)  # issue 19: the in-repo FP8 forward's tests, then each accumulator-promotion setting against the bf16
    # forward on the FA sweep's shapes, with accuracy against the FP64 oracle (benchmarks/fp8_promotion.py)
    setup
    FLASH_ATTN_AUTOTUNE=0 timeout 70 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_flash_attn.py -k fp8 \
        > "$OUT/fp8-tests.log" 2>&1
    echo "fp8 tests exit $?" >> "$OUT/fp8-tests.log"
    timeout "${FP8_SECONDS:-480}" python3 benchmarks/fp8_promotion.py ${FP8_ARGS:-} > "$OUT/fp8-promotion.log" 2>&1
    echo "fp8_promotion exit $?" >> "$OUT/fp8-promotion.log"
    summary "$OUT/fp8-tests.log" 4
    grep -A 40 "^## Time" "$OUT/fp8-promotion.log" || tail -n 30 "$OUT/fp8-promotion.log"
    ;;
fp8-configs)  # issue 19: each FP8 forward tile config alone (registers, spills, wgmma or not, time), both V layouts
    setup
    timeout "${FP8_SECONDS:-300}" python3 benchmarks/fp8_configs.py ${FP8_ARGS:-} > "$OUT/fp8-configs.log" 2>&1
    echo "fp8_configs exit $?" >> "$OUT/fp8-configs.log"
    grep -E "^\||exit" "$OUT/fp8-configs.log"
    ;;
issue17)  # issue 17's open ends: the recorded defects' examples re-run at seed 0, each in a process of its own
    # (flash-attn-4 and FLA installed first: fa4-0 to fa4-N, then carry .fa4-in and .whl); decode_sdpa's one
    # non-deterministic forward (fuzz-10m B) replayed 20 times per SDPA backend; FLA fused_chunk's dg at 10.1x
    # against sequence length, beside FLA's chunk kernel, two seeds
    setup
    timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/check/test_known_issues.py \
        > "$OUT/known.log" 2>&1
    echo "known-issue tests exit $?" >> "$OUT/known.log"
    timeout 120 python3 benchmarks/replay_case.py --backend decode_sdpa --seed 202000607 --repeat 20 \
        --case 'B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16' --sdpa default,efficient,cudnn,math \
        > "$OUT/decode-replay.log" 2>&1
    echo "decode replay exit $?" >> "$OUT/decode-replay.log"
    cases=()
    for t in 250 1000 1998 4000 8000; do cases+=(--case "B4-H4-T$t-K64V64-g(n=1)-h0-dhT-bf16"); done
    ATTN_HARNESS_FLA_AUTOTUNE=0 timeout 200 python3 benchmarks/replay_case.py --backend fla_fused_chunk,fla_chunk \
        --seed 202000615,7 --repeat 1 "${cases[@]}" > "$OUT/fla-dg.log" 2>&1
    echo "fla dg exit $?" >> "$OUT/fla-dg.log"
    summary "$OUT/known.log" 14
    grep -A 8 "^summary" "$OUT/decode-replay.log"; tail -n 1 "$OUT/decode-replay.log"
    grep -E "^fla_" "$OUT/fla-dg.log" | sed -E 's/^([a-z_]+) +[a-z]+ +([^ ]+) ([^ ]+) #0: ([a-z]+).*(dg=[^ ]+).*/\1 \2 \3 \4 \5/'
    tail -n 1 "$OUT/fla-dg.log"
    ;;
issue17b)  # issue 17: the standalone repro of torch SDPA cuDNN's non-repeatable decode forward, and FLA fused_chunk's
    # dg (error growing with sequence length) shrunk from its longest failing case, with its repro script (carry .whl)
    setup
    d="$OUT/issue17b"; mkdir -p "$d"
    timeout 150 python3 docs/repro/sdpa-cudnn-decode/repro_sdpa_cudnn_decode_determinism.py > "$d/sdpa-cudnn.log" 2>&1
    echo "repro exit $? (1: the defect reproduced)" >> "$d/sdpa-cudnn.log"
    shrink_case "$d" fla-dg fla_fused_chunk 'B4-H4-T8000-K64V64-g(n=1)-h0-dhT-bf16' 7 --family linear --max-checks 14
    cat "$d/sdpa-cudnn.log"; summary "$d/fla-dg.log" 12
    tarred issue17b
    ;;
fp8-sweep)  # issue 19: the FP8 sweep's forward, the in-repo FP8 kernel beside the bf16 kernels of the same run (the
    # report's accuracy table puts each FP8 cell's error beside its bf16 twin's), after the FP8 GPU tests
    setup
    FLASH_ATTN_AUTOTUNE=0 timeout 70 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_flash_attn.py -k fp8 \
        > "$OUT/fp8-tests.log" 2>&1
    echo "fp8 tests exit $?" >> "$OUT/fp8-tests.log"
    timeout 470 python3 -m harness bench --preset fp8-sweep --modes fwd --no-plots --time-limit 390 \
        --backends "${FP8_BACKENDS:-triton_fa_fp8,triton_fa,sdpa_cudnn}" --out "$OUT/fp8-sweep" > "$OUT/fp8-sweep.log" 2>&1
    echo "bench exit $?" >> "$OUT/fp8-sweep.log"
    summary "$OUT/fp8-tests.log" 3; tail -n 1 "$OUT/fp8-sweep.log"
    grep -A 30 "TFLOP/s by" "$OUT/fp8-sweep/report.md" | head -n 60
    tarred fp8-sweep
    ;;
fp8-mma)  # issue 19, session 24: the FP8 forward with V's keys in the MMA order (P used as its MMA registers hold
    # it): the FP8 kernel tests (and the Gluon kernel's, which reads V in key order), then the kernel alone in both
    # orders with the bf16 pick, interleaved (benchmarks/fp8_causal_probe.py --mma-order)
    setup
    # (PROBE_EXTRA: more probe options, e.g. "--narrow off,on --masks yes")
    FLASH_ATTN_AUTOTUNE=0 timeout "${TEST_SECONDS:-240}" python3 -m pytest -q -p no:cacheprovider \
        tests/kernels/test_flash_attn.py tests/kernels/test_fp8_gluon.py -k "fp8 or narrow" ${TEST_ARGS:-} > "$OUT/fp8-tests.log" 2>&1
    echo "fp8 tests exit $?" >> "$OUT/fp8-tests.log"
    timeout "${PROBE_SECONDS:-380}" python3 benchmarks/fp8_causal_probe.py --head-dims "${PROBE_DIMS:-64,128}" \
        --seqlens "${PROBE_SEQLENS:-4096,16384}" --tiles 2 --mma-order --bf16 --repeat "${PROBE_REPEAT:-2}" \
        ${PROBE_EXTRA:-} --label s24 > "$OUT/fp8-mma.log" 2>&1
    echo "probe exit $?" >> "$OUT/fp8-mma.log"
    summary "$OUT/fp8-tests.log" 4; cat "$OUT/fp8-mma.log"
    ;;
fp8-overlap)  # issue 19, session 25: whole FP8 forward calls with the V copy overlapped (configs.FP8_V_OVERLAP) or
    # not, the bf16 forward beside, after a race check (benchmarks/fp8_overlap_probe.py; OVERLAP_ARGS: its options)
    setup
    FLASH_ATTN_AUTOTUNE=0 timeout "${PROBE_SECONDS:-300}" python3 benchmarks/fp8_overlap_probe.py \
        ${OVERLAP_ARGS:---head-dims 64 --seqlens 4096,16384 --repeat 2} > "$OUT/fp8-overlap.log" 2>&1
    echo "probe exit $?" >> "$OUT/fp8-overlap.log"
    cat "$OUT/fp8-overlap.log"
    ;;
desc-cost)  # issue 19 (session 26's open question): what a device-side TMA descriptor costs a program, from two
    # kernels loading the same tiles through one descriptor or one each (benchmarks/desc_cost_probe.py; DESC_ARGS)
    setup
    timeout 200 python3 benchmarks/desc_cost_probe.py ${DESC_ARGS:-} > "$OUT/desc-cost.log" 2>&1
    echo "probe exit $?" >> "$OUT/desc-cost.log"
    cat "$OUT/desc-cost.log"
    ;;
fp8-must)  # issue 19's must through the harness: the FP8 sweep's forward at hd 64 / 128 (FP8_CASES), the in-repo FP8
    # and bf16 forwards beside cuDNN's FP8 (carry .whl-cudnn), autotuned, one run (FP8_ROUNDS passes over it, bench
    # --rounds); the report's TFLOP/s table last
    setup
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-cudnn/*.whl > /dev/null 2>&1
    timeout "${FP8_SECONDS:-540}" python3 -m harness bench --preset fp8-sweep --modes fwd --no-plots \
        --time-limit "${FP8_LIMIT:-500}" --cases "${FP8_CASES:-S(4096|16384)x[0-9]+-D(64|128)-}" --rounds "${FP8_ROUNDS:-1}" \
        --backends "${FP8_BACKENDS:-triton_fa_fp8,triton_fa,cudnn_fp8}" --out "$OUT/fp8-must" > "$OUT/fp8-must.log" 2>&1
    echo "bench exit $?" >> "$OUT/fp8-must.log"
    tail -n 2 "$OUT/fp8-must.log"
    grep -A 6 "^### TFLOP/s" "$OUT/fp8-must/report.md" | grep -v "^$" | head -n 80
    tarred fp8-must
    ;;
gluon-ws)  # issue 16 (sessions 30-31): the 16-bit warp-specialised Gluon forward's GPU tests (each part under its
    # own timeout: a barrier mistake hangs; GLUON_TESTS: pytest -k parts, ';'-separated, 0 none), then the probe: hd 128's
    # configs (GLUON_WS) beside the Triton forward, cuDNN and FA2 on the FA sweep (GLUON_SEQLENS), real models and
    # the attention layers' GQA / MQA rows (GLUON_EXTRA, default --models --layers), and the MLA training form
    # (GLUON_MLA_WS; GLUON_MLA=0 skips it); GLUON_DIMS: the probe's head dims (default 128; e.g. 64 with
    # GLUON_WS="128,3 w3:64,4" for the three-consumer kernel)
    setup
    mkdir -p "$OUT/gluon-ws"
    IFS=';' read -r -a parts <<< "${GLUON_TESTS:-not persistent and not mla;persistent;mla}"
    [ "${GLUON_TESTS:-}" = 0 ] && parts=()  # GLUON_TESTS=0: the probe only
    for part in "${parts[@]}"; do
        FLASH_ATTN_AUTOTUNE=0 timeout 200 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -n 8 \
            tests/kernels/test_gluon_ws.py -k "$part" >> "$OUT/gluon-ws/tests.log" 2>&1
        echo "tests ($part) exit $?" >> "$OUT/gluon-ws/tests.log"
    done
    dims=${GLUON_DIMS:-128}
    timeout "${GLUON_SECONDS:-280}" python3 benchmarks/gluon_ws_probe.py --head-dims "$dims" \
        --ws ${GLUON_WS:-128,3 p:128,3} --seqlens "${GLUON_SEQLENS:-512,1024,4096}" ${GLUON_EXTRA---models --layers} \
        --repeat 2 > "$OUT/gluon-ws/probe-hd$dims.md" 2>&1
    echo "probe exit $?" >> "$OUT/gluon-ws/probe-hd$dims.md"
    if [ "${GLUON_MLA:-1}" = 1 ]; then
        timeout 150 python3 benchmarks/gluon_ws_probe.py --head-dims 192/128 --ws ${GLUON_MLA_WS:-64,4} \
            --seqlens 512,1024 --repeat 2 > "$OUT/gluon-ws/probe-mla.md" 2>&1
        echo "probe exit $?" >> "$OUT/gluon-ws/probe-mla.md"
    fi
    grep -E "exit|passed|failed|FAIL" "$OUT/gluon-ws/tests.log" "$OUT/gluon-ws/"probe-*.md | head -n 30
    for f in "$OUT/gluon-ws/"probe-*.md; do grep "^| summary" "$f" | cut -d'|' -f3-9,11 | tail -n 45; done
    tarred gluon-ws
    ;;
gluon-bwd)  # issue 16 (session 31): the warp-specialised Gluon backward kernels, dQ and dK / dV (built without a
    # GPU): their GPU tests under a timeout (a barrier mistake hangs), then the probe against the Triton kernels
    # replayed alone and the whole backwards (GLUON_BWD_DKDV, GLUON_BWD_DQ, GLUON_BWD_SEQLENS, GLUON_BWD_DIMS;
    # GLUON_BWD_EXTRA default --models, add --autotune for the Triton kernels' autotuned configs; GLUON_BWD_TESTS=0
    # skips the tests)
    setup
    mkdir -p "$OUT/gluon-bwd"
    if [ "${GLUON_BWD_TESTS:-1}" = 1 ]; then
        FLASH_ATTN_AUTOTUNE=0 timeout 200 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -n 8 \
            tests/kernels/test_bwd_gluon.py > "$OUT/gluon-bwd/tests.log" 2>&1
        echo "tests exit $?" >> "$OUT/gluon-bwd/tests.log"
    fi
    timeout "${GLUON_BWD_SECONDS:-330}" python3 benchmarks/gluon_bwd_probe.py --head-dims "${GLUON_BWD_DIMS:-64,128}" \
        --dkdv ${GLUON_BWD_DKDV:-64,2 32,3} --dq ${GLUON_BWD_DQ:-64,3 128,2} \
        --seqlens "${GLUON_BWD_SEQLENS:-1024,4096,16384}" ${GLUON_BWD_EXTRA---models} --repeat 2 \
        > "$OUT/gluon-bwd/probe.md" 2>&1
    echo "probe exit $?" >> "$OUT/gluon-bwd/probe.md"
    grep -hE "exit|passed|failed|FAIL" "$OUT/gluon-bwd/"*.* | head -n 20
    grep "^| summary" "$OUT/gluon-bwd/probe.md" | cut -d'|' -f3-9 | tail -n 60
    grep "^| speed-up" "$OUT/gluon-bwd/probe.md" | cut -d'|' -f3-11 | tail -n 30  # (per repeat: the decisions)
    tarred gluon-bwd
    ;;
probe-whole)  # issue 16 (session 43, runbook item 0): gluon_bwd_probe.py --whole, the fused kernel alone and the whole
    # fused backward at each config side by side: hd 64 non-causal 128,2 against 64,3,t0 (1.045x alone, 1.013x
    # through the harness in session 43), hd 64 causal's no-turns neighbours, hd 128 causal with and without the mask
    # on every tile; each probe under its own timeout (PROBE_SECONDS, default 170), its log kept whole
    setup
    mkdir -p "$OUT/probe-whole"
    for run in "64 no 4096,16384 128,2 64,3,t0" "64 yes 4096,16384 64,2,t0 64,3,t0 128,2,t0" \
               "128 yes 4096 64,2 64,2,m1"; do
        set -- $run
        hd=$1 masks=$2 seqlens=$3; shift 3
        log="$OUT/probe-whole/hd$hd-causal-$masks.md"
        timeout "${PROBE_SECONDS:-170}" python3 benchmarks/gluon_bwd_probe.py --head-dims "$hd" --masks "$masks" \
            --seqlens "$seqlens" --dkdv 64,2 --dq 128,2 --fused "$@" --whole --repeat 3 > "$log" 2>&1
        echo "probe exit $?" >> "$log"
        grep -hE "FAIL|probe exit" "$log" | head -n 5
        python3 benchmarks/gluon_bwd_probe.py --from-log "$log" | grep -E "fused whole|gluon fused|fused bwd"
    done
    tarred probe-whole
    ;;
persistent)  # issue 16 (sessions 44-45, built without a GPU): the persistent dK / dV, fused and dQ kernels (one program
    # an SM over the tiles, bwd_gluon's PERSISTENT) at the short lengths where the timeline put 10-28% of the SMs'
    # time between programs: their GPU tests first (a wrong barrier phase hangs: the timeout), then per routed cell
    # the kernels alone and the fused backward whole with and without ,p1 (PROBE_SECONDS each, default 90; hd 128's
    # dQ kernel too), then hd 64 causal's timeline both ways (the gaps should be gone; the programs' entry stamps
    # split a gap into the CTA's launch and its set-up)
    setup
    mkdir -p "$OUT/persistent"
    FLASH_ATTN_AUTOTUNE=0 timeout 180 python3 -m pytest -q -n 8 -m gpu tests/kernels/test_bwd_gluon.py -k persistent \
        -p no:cacheprovider > "$OUT/persistent/tests.log" 2>&1
    echo "tests exit $?" >> "$OUT/persistent/tests.log"
    tail -n 3 "$OUT/persistent/tests.log"
    for run in "64 yes 64,2,t0 -" "64 no 128,2 -" "128 no 64,3,a1 128,2,p1" "128 yes 64,2,m1 128,2,p1"; do
        set -- $run  # (the fourth: the persistent dQ config, "-" none: hd 64's dQ kernel is not routed)
        dq_p=""; [ "$4" = - ] || dq_p="$4"
        log="$OUT/persistent/hd$1-causal-$2.md"
        timeout "${PROBE_SECONDS:-90}" python3 benchmarks/gluon_bwd_probe.py --head-dims "$1" --masks "$2" \
            --seqlens 1024,2048 --dkdv 64,2 64,2,p1 --dq 128,2 $dq_p --fused "$3" "$3,p1" --whole --repeat 3 \
            > "$log" 2>&1
        echo "probe exit $?" >> "$log"
        grep -hE "FAIL|probe exit" "$log" | head -n 3
        python3 benchmarks/gluon_bwd_probe.py --from-log "$log" | grep -E "gluon dkdv|gluon dq|gluon fused|fused whole"
    done
    log="$OUT/persistent/timeline-hd64-causal-yes.md"  # (both kernels both ways: the gaps, their launch / set-up)
    timeout 90 python3 benchmarks/gluon_bwd_probe.py --head-dims 64 --masks yes --seqlens 1024,2048 \
        --dkdv 64,2 64,2,p1 --dq 128,2 --fused 64,2,t0 64,2,t0,p1 --timeline --repeat 0 > "$log" 2>&1
    echo "probe exit $?" >> "$log"
    grep "^| timeline | [0-9]" "$log" | cut -d'|' -f3-8,10-24
    tarred persistent
    ;;
timeline)  # issue 16 (session 43, runbook item 1): where the SMs' time goes in the backward's kernels at 1k and 16k
    # (gluon_bwd_probe.py --timeline --repeat 0: each config's kernel once with its programs' timeline stamps after
    # the oracle check): the loop, each program's prologue and epilogue, the gaps between programs on an SM, idle head
    # and tail; the routed configs of hd 64 / 128, both masks
    setup
    mkdir -p "$OUT/timeline"
    for run in "128 no 64,3,a1" "128 yes 64,2,m1" "64 no 128,2" "64 yes 64,2,t0"; do
        set -- $run
        log="$OUT/timeline/hd$1-causal-$2.md"
        timeout "${TIMELINE_SECONDS:-130}" python3 benchmarks/gluon_bwd_probe.py --head-dims "$1" --masks "$2" \
            --seqlens 1024,2048,16384 --dkdv 64,2 --dq 128,2 --fused "$3" --timeline --repeat 0 > "$log" 2>&1
        echo "probe exit $?" >> "$log"
        grep -hE "FAIL|probe exit" "$log" | head -n 3
        grep "^| timeline | [0-9]" "$log" | cut -d'|' -f3-8,10-24
    done
    tarred timeline
    ;;
pipes)  # issue 16 (session 56): which pipe binds the Gluon forward's softmax, read by Nsight Compute (ncu, on a
    # Firecracker machine; gVisor has no counters) on one launch of each variant (benchmarks/pipes_probe.py; the third
    # call, after the compile and a warm-up), with and without the cubic exp2 share that lost 0.86-0.90x in session
    # 56; then benchmarks/pipes_table.py's table. PIPES: space-separated NAME:ARGS (ARGS: pipes_probe.py's, + for
    # spaces); default hd 64's Gluon cell and the capped hd 128 forward, each with and without the cubic.
    # PIPES_SOURCE=1 (session 57; first run in session 58): a second ncu run a variant with the SourceCounters
    # section, its source page per SASS instruction (NAME.source.csv), then benchmarks/pipes_source.py's stalls by
    # reason, by instruction family (named barriers, mbarrier waits, wgmma waits) and heaviest instructions. A NAME
    # may name the kernel to profile, NAME=REGEX (default _fwd_ws): e.g. dkdv=_bwd_dkdv with pipes_probe.py's
    # --backward
    setup
    mkdir -p "$OUT/pipes"
    command -v ncu > /dev/null || { echo "pipes: ncu not on the PATH"; exit 2; }
    for v in ${PIPES:-hd64-e0:--shape+4,4096,32,32+--head-dim+64 hd64-e4:--shape+4,4096,32,32+--head-dim+64+--exp2-every+4 \
               hd128cap-e0:--shape+2,4096,32,16+--causal+--softcap+50 \
               hd128cap-e2:--shape+2,4096,32,16+--causal+--softcap+50+--exp2-every+2}; do
        name=${v%%:*}; args=${v#*:}; kernel=_fwd_ws
        if [[ $name == *=* ]]; then kernel=${name#*=}; name=${name%%=*}; fi
        timeout "${PIPES_SECONDS:-150}" ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 \
            --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
            --section InstructionStats --csv --page raw python3 benchmarks/pipes_probe.py ${args//+/ } \
            > "$OUT/pipes/$name.csv" 2> "$OUT/pipes/$name.log"
        echo "$name: ncu exit $?"; grep -h "route:\|ERR\|rror" "$OUT/pipes/$name.csv" "$OUT/pipes/$name.log" | head -n 3
        if [ -n "${PIPES_SOURCE:-}" ]; then
            timeout "${PIPES_SECONDS:-150}" ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 \
                --launch-count 1 --section SourceCounters --page source --print-source sass --csv \
                python3 benchmarks/pipes_probe.py ${args//+/ } > "$OUT/pipes/$name.source.csv" 2>> "$OUT/pipes/$name.log"
            echo "$name: ncu source page exit $?"
        fi
    done
    python3 benchmarks/pipes_table.py "$OUT/pipes" | tee "$OUT/pipes/table.md"
    if [ -n "${PIPES_SOURCE:-}" ]; then python3 benchmarks/pipes_source.py "$OUT/pipes" | tee "$OUT/pipes/source.md"; fi
    tarred pipes
    ;;
tma-reduce)  # issue 16 (session 33): Hopper's TMA reduce-add from Gluon (benchmarks/tma_reduce_probe.py, built on the
    # CPU): its sums checked, then GB/s against TMA stores and per-element atomics, in an L2-sized buffer and a
    # dQ-sized one (fp32 [B*S*H, 128] at the FA sweep's hd 128 4k: 128 MiB)
    setup
    mkdir -p "$OUT/tma-reduce"
    for rows in 16384 262144; do
        timeout 120 python3 benchmarks/tma_reduce_probe.py --rows "$rows" --repeats 8,64 \
            > "$OUT/tma-reduce/rows-$rows.md" 2>&1
        echo "probe exit $?" >> "$OUT/tma-reduce/rows-$rows.md"
    done
    cat "$OUT/tma-reduce/"*.md
    tarred tma-reduce
    ;;
fused-ordered)  # issue 16 (sessions 35-36): the fused backward's GPU tests (the preprocess zeroes dQ's buffer; the
    # whole-backward tests) and the ordered (deterministic) variant's, under one timeout (a wrong add order hangs),
    # then the probe: the ordered kernel checked twice bitwise in both launch orders, then timed (and its build
    # without turn waits) beside the unordered fused kernel and the split route, causal hd 128 / 64 at 4k and 16k
    # (FUSED_MASKS=no: non-causal; Triton pinned; session 36: 230-320 s before the no-wait row)
    setup
    mkdir -p "$OUT/fused-ordered"
    bwd_gluon_tests fused-ordered "fused or ordered" "${FUSED_TESTS_SECONDS:-200}"
    rc=$?
    ordered=--ordered; [ "$rc" = 0 ] || ordered=""  # a failed or hung ordered kernel is not timed
    timeout "${FUSED_PROBE_SECONDS:-370}" python3 benchmarks/gluon_bwd_probe.py --head-dims 128,64 \
        --masks "${FUSED_MASKS:-yes}" \
        --seqlens 4096,16384 --dkdv 64,2 --dq 64,3 --fused 64,2 $ordered --repeat 2 \
        > "$OUT/fused-ordered/probe.md" 2>&1
    echo "probe exit $?" >> "$OUT/fused-ordered/probe.md"
    tail -n 12 "$OUT/fused-ordered/tests.log"
    grep -E "^\| summary|FAIL|exit" "$OUT/fused-ordered/probe.md" | tail -n 40
    tarred fused-ordered
    ;;
fused-adder)  # issue 16 (session 37): the fused kernel's dQ adds in an adder warp (the ordered kernel's structure
    # without its turns) against the consumers' own adds, hd 128 at 4k / 8k / 16k, three repeats, after the fused /
    # ordered / adder GPU tests. FUSED_MASKS no (default, both stage counts: 64,3 is the routed one) or yes
    # (FUSED_CONFIGS="64,2"); FUSED_ORDERED=--ordered adds the ordered kernel's rows, FUSED_EXTRA=--models the
    # Llama-3 GQA cells
    setup
    mkdir -p "$OUT/fused-adder"
    if bwd_gluon_tests fused-adder "fused or ordered" "${FUSED_TESTS_SECONDS:-200}"; then
        # shellcheck disable=SC2086
        timeout "${FUSED_PROBE_SECONDS:-380}" python3 benchmarks/gluon_bwd_probe.py --head-dims "${FUSED_DIMS:-128}" \
            --masks "${FUSED_MASKS:-no}" --seqlens "${FUSED_SEQLENS:-4096,8192,16384}" --dkdv 64,2 --dq 64,3 \
            --fused ${FUSED_CONFIGS:-64,2 64,3} --adder ${FUSED_ORDERED:-} ${FUSED_EXTRA:-} --repeat "${FUSED_REPEAT:-3}" \
            > "$OUT/fused-adder/probe.md" 2>&1
        echo "probe exit $?" >> "$OUT/fused-adder/probe.md"
    fi
    tail -n 12 "$OUT/fused-adder/tests.log"
    [ -f "$OUT/fused-adder/probe.md" ] && grep -E "^\| summary|FAIL|exit" "$OUT/fused-adder/probe.md" | grep -v "triton d\|gluon d" | tail -n 40
    tarred fused-adder
    ;;
gqa-walks)  # issue 16 (session 37): the dK / dV kernels' (head, tile) walks on GQA (flat loop, lockstep) after the
    # backward GPU tests that run them, then benchmarks/fused_gqa_check.py --walks (three interleaved repeats;
    # WALK_MODE=--route-walks: the whole default backward routed against the nested walk)
    setup
    mkdir -p "$OUT/gqa-walks"
    if bwd_gluon_tests gqa-walks "walk or fused or dkdv or backward" "${WALK_TESTS_SECONDS:-200}"; then
        timeout "${WALK_PROBE_SECONDS:-360}" python3 benchmarks/fused_gqa_check.py "${WALK_MODE:---walks}" \
            > "$OUT/gqa-walks/walks.md" 2>&1
        echo "walks exit $?" >> "$OUT/gqa-walks/walks.md"
    fi
    tail -n 6 "$OUT/gqa-walks/tests.log"
    [ -f "$OUT/gqa-walks/walks.md" ] && python3 - "$OUT/gqa-walks/walks.md" <<'PY'
import collections, sys
best = collections.OrderedDict()
for line in open(sys.argv[1]):
    p = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(p) in (3, 4) and p[-1].replace(".", "").isdigit():
        key = tuple(p[:-1])
        best[key] = min(best.get(key, 1e9), float(p[-1]))
for key, ms in best.items():
    print("| " + " | ".join(key) + f" | {ms:.4f} |")
PY
    tarred gqa-walks
    ;;
gluon-route)  # issue 16 (session 32): the GPU tests of the routed Gluon forward (persistent orders, MLA) and backward
    # (dQ, dK / dV, the default route by length), both files under one timeout (a barrier mistake hangs)
    setup
    mkdir -p "$OUT/gluon-route"
    FLASH_ATTN_AUTOTUNE=0 timeout "${GLUON_ROUTE_SECONDS:-280}" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        -n 8 -m gpu --durations=8 tests/kernels/test_gluon_ws.py tests/kernels/test_bwd_gluon.py \
        > "$OUT/gluon-route/tests.log" 2>&1
    echo "tests exit $?" >> "$OUT/gluon-route/tests.log"
    tail -n 25 "$OUT/gluon-route/tests.log"
    tarred gluon-route
    ;;
gpu-tests)  # issue 7: the sm90 matrix, all dtypes or `gpu-tests fp16` (one per call fits 600 s)
    setup
    start=$(date +%s)
    session=gpu-tests
    [ -n "${2:-}" ] && session="gpu-tests(dtype='$2', arch='sm90')"
    # SIGINT, not SIGTERM, at the limit: pytest then still prints its summary and the slowest tests
    timeout -s INT 560 python3 -m nox --no-venv -s "$session" -- --durations=40 > "$OUT/gpu-tests.log" 2>&1
    echo "nox $session exit $? after $(( $(date +%s) - start )) s" >> "$OUT/gpu-tests.log"
    (cd reports && tar czf "$OUT/gpu-tests-logs.tgz" gpu-tests-*)
    grep -E "^nox > (Session|Ran)|exit" "$OUT/gpu-tests.log" | tail -n 8
    python3 -m harness.result_log reports/gpu-tests-*/*.jsonl --slowest 25
    ;;
*)
    echo "unknown step $step" >&2; exit 2
    ;;
esac
