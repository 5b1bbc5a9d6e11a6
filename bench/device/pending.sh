#!/usr/bin/env bash
# The GPU receipts still owed, one device call per step (each ends inside the 600 s call limit).
# Run from the repository root on the GPU box, with carry [".whl", ".device"] (bench/device/make_kit.sh;
# `checks`/`redteam` carry ".pgkit" too, `llamacpp`/`moe`/`experts` ".llama": both at once pass the 64 MiB):
#   bash bench/device/pending.sh checks      # issue 14: red-team suite, NVML idle probe, per-step logits
#   bash bench/device/pending.sh redteam     # issue 14: the red-team suite alone
#   bash bench/device/pending.sh calibrate   # issue 13: a fresh worker's self-calibration (repeat until done)
#   bash bench/device/pending.sh placebo     # issues 13/19: A/A pairs beyond calibration (repeat; one model's
#                                            # alone: CAL_ARGS="--placebo-models qwen35-0.8b-q8_0", ~7 s a pair)
#   bash bench/device/pending.sh detect      # issue 13: planted 1/2/5 % slowdowns (repeat; a short session:
#                                            # CAL_ARGS="--plants 1,2 --detect-pairs 5")
#   bash bench/device/pending.sh e2e         # issue 19: the Celery gpu task on planted PRs (after calibrate on the
#                                            # same box; E2E_ARGS="--cases aa,decode_slow": some cases first)
#   bash bench/device/pending.sh profile     # issue 17: where pp512's fixed cost goes (0.8B, 9B, 27B)
#   bash bench/device/pending.sh moeprofile  # issue 17: the MoE's pp512 / pp4096 and its decode token, profiled
#   bash bench/device/pending.sh grouped     # issue 17: the MoE prefill's grouped-GEMM tiles (no file, ~1-2 min)
#   bash bench/device/pending.sh dprofile    # issue 17: one decode token's kernels in order (4B, 9B)
#   bash bench/device/pending.sh tiles       # issue 17: 4B GEMV tiles on int8 x at BB=2, then decode end to end
#   bash bench/device/pending.sh noise       # issue 13: decode noise by fresh pair x per-step-logits copy mode
#   bash bench/device/pending.sh prefillcpu  # issue 13: 0.8B prefill noise, revisions on every core vs one
#   bash bench/device/pending.sh graphs      # issue 17: prefill from a CUDA graph vs eager (the 0.8B is host-bound)
#   bash bench/device/pending.sh llamacpp    # issue 17: same-call llama.cpp prefill ratios (carry .llama too;
#                                            # LLAMA_MODE=decode: tg128 ratios instead)
#   bash bench/device/pending.sh gemm512     # issue 17: pp512/pp1024 with the tile GEMM vs dequantize+cuBLAS
#   bash bench/device/pending.sh moe         # issue 17: 35B-A3B tg128/pp512/pp4096 vs llama.cpp, same file and call;
#                                            # the routed experts on the dense GEMV paths (moe_experts/gemv_path.py):
#     MOE_VARIANTS=default+s16d16w4split-words,default+s16d16w4split-x8,default+s16d16w4split-x8q6,default+s16d16w4split-x8-shared,default+s16d16w4split-x8q6-shared,default+s32d16w4split-x8
#     MOE_PREFILL_VARIANTS=graph,bm16bn64w4,graph+bm16bn64w4,bm32bn64w4  # eager, ~16 rows an expert padded to 64
#   bash bench/device/pending.sh experts     # issue 17: routed-expert tiles (tile path vs the dense GEMV paths) at the
#                                            # 35B-A3B's shapes on random stacks: no 21 GB file, ~1-2 min
#                                            # (MOE_PREP=1, carry .llama: builds llama-bench and makes the MoE's
#                                            # file meanwhile, ~350 s, so that `moe` next on the warm box is short)
#   bash bench/device/pending.sh moetiles    # issue 17: the MoE's dense GEMV shapes swept, that table end to end, profile
#   LONGCTX_MODELS=9b bash bench/device/pending.sh longctx  # issue 17: KL/top-1 vs the fp32 reference at 32k and
#                                            # 128k, decode after (one model per call: 9B ~400 s estimated; then 0.8b)
#   SIZE=27b bash bench/device/pending.sh sizes  # issue 17: 2B (default) or 27B decode/prefill/memory/KL receipts
#   SIZE=27b bash bench/device/pending.sh refkl  # issue 17: the 27B's KL vs the fp32 reference (made on use), tg128 @0
# State (history, clones, models) lives in /var/tmp and survives between calls while the machine is
# warm (30 s); every step copies what it measured to $OUT. The device's git HEAD is the last landed
# commit: the bench scripts check out the working tree (bench/tree_snapshot.py).
set -uo pipefail
# Several steps may share one call (`pending.sh checks calibrate`): one clock for all of them.
[ $# -ge 1 ] || { echo "usage: pending.sh STEP..."; exit 2; }
T0=$(date +%s)
left() { echo $(( ${1:-${PENDING_BUDGET:-570}} - ($(date +%s) - T0) )); }  # PENDING_BUDGET: a shorter call
bash bench/device/setup.sh
export PYTHONPATH=$PWD TOKENGATE_CACHE_DIR=/var/tmp/tgcache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,uuid,memory.used --format=csv > "$OUT/gpu.txt"
# A fresh box continuing the placebo or detection: the committed state of an earlier card (its calibration
# gives the floors; this card's pairs are pooled in as another card's).
# Committed states are named by the card's model (cal-state-h200-*, cal-state-h100-*): only this model's restore.
GPU_MODEL=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -q H100 && echo h100 || echo h200)
# A card seen before (the same UUID: its history's key matches if driver, torch and triton do too) restores its own
# committed state for every step, `calibrate` and `e2e` included: the worker's history of this very card, as a warm
# worker keeps it. The worker itself decides whether that history still counts (worker/calibration/key.py).
GPU_UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -1 | cut -c1-12)
restore() {  # $1: a glob narrower than the card model's (this card's UUID)
  [ -f /var/tmp/cal/state.json ] && return 0
  # the newest by its stamp (the names sort by card first); an older protocol's state is history, not a floor
  local st; st=$(for f in bench/receipts/cal-state-$GPU_MODEL-${1:-}*.json; do [ -f "$f" ] && echo "${f##*-} $f"; done \
    | sort | tail -1 | cut -d' ' -f2); [ -n "$st" ] || return 0
  local tag; tag=$(basename "$st" .json); tag=${tag#cal-state-$GPU_MODEL-}
  mkdir -p /var/tmp/cal && cp "$st" /var/tmp/cal/state.json \
    && cp "bench/receipts/aa-history-$GPU_MODEL-$tag.sqlite" /var/tmp/cal/history.sqlite || return 1
  echo "restored $st"; }
[ -n "$GPU_UUID" ] && restore "$GPU_UUID-"
cal() { [ "$1" = calibrate ] || restore
        timeout $(( $(left) )) python3 bench/worker/gpu_calibration.py --state /var/tmp/cal --profile standard --out "$OUT" \
          "$1" ${CAL_ARGS:-} --budget $(( $(left) - 90 )) 2>&1 | tee "$OUT/$1.log" | tail -5
        # only files that exist: a card model with no committed history leaves its glob unmatched
        python3 bench/worker/gpu_calibration.py --state /var/tmp/cal --out "$OUT" report --pool /var/tmp/cal/history.sqlite \
          $(ls bench/receipts/aa-history-$GPU_MODEL-*.sqlite 2>/dev/null) 2>&1 | tail -4
        cp /var/tmp/cal/state.json "$OUT/cal-state.json"; cp /var/tmp/cal/history.sqlite "$OUT/cal-history.sqlite"; }
# PostgreSQL for the red team's database attacks (a GPU worker has none; the attacks must still meet one):
# the binaries of the pgserver wheel in the kit, run as nobody (postgres refuses root), trust, 127.0.0.1:5432.
# uid/gid 65534 with no groups, by Python: the box may lack util-linux's setpriv.
as_nobody() { python3 -c 'import os, sys; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])' "$@"; }
start_pg() {
  python3 -c "import socket; socket.create_connection(('127.0.0.1', 5432), 1)" 2>/dev/null && return 0
  local b; b=$(python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('pgserver').origin))" \
    2>/dev/null)/pginstall/bin
  chmod +x "$b"/* 2>/dev/null; [ -x "$b/postgres" ] || { echo "no PostgreSQL binaries: carry .pgkit (the pgserver wheel)"; return 1; }
  mkdir -p /var/tmp/pgdata /var/run/postgresql && chown 65534:65534 /var/tmp/pgdata /var/run/postgresql
  [ -f /var/tmp/pgdata/PG_VERSION ] || as_nobody "$b/initdb" -D /var/tmp/pgdata -U postgres --auth=trust >/dev/null
  as_nobody "$b/pg_ctl" -D /var/tmp/pgdata -l /var/tmp/pgdata/log -o "-h 127.0.0.1 -p 5432 -k /var/run/postgresql" -w start \
    >/dev/null && echo "PostgreSQL up (pgserver binaries)"; }
# llama.cpp 3f545be built on the box from the carried .llama (bench/device/llama_src.py here), once per box.
LB=/var/tmp/llama-build
build_llama() {
  if [ ! -x $LB/bin/llama-bench ]; then
    cmake -S .llama -B $LB -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > "$OUT/llama-build.log" 2>&1 \
      && timeout $(( $(left) - 150 )) ninja -C $LB -j16 llama-bench >> "$OUT/llama-build.log" 2>&1
    echo "llama-bench build rc=$? in $(( $(date +%s) - T0 )) s of the call"
  fi
  [ -x $LB/bin/llama-bench ] || { tail -5 "$OUT/llama-build.log"; return 1; }; }
for step in "$@"; do
[ "$(left)" -gt 60 ] || { echo "no time left for $step"; break; }
case $step in
  checks|redteam)  # Redis and PostgreSQL up, so the red team's attacks on both run on the GPU box too
    redis-cli ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" >/dev/null
    start_pg
    # one process (-o addopts: the box has no pytest-xdist, and every red-team test is `timed` anyway)
    timeout 200 python3 -m pytest -q -rs -o addopts="" -p no:xdist tests/worker/redteam -p no:cacheprovider > "$OUT/redteam-$GPU_MODEL.log" 2>&1
    echo "redteam rc=$?"; tail -3 "$OUT/redteam-$GPU_MODEL.log"
    [ "$step" = redteam ] && continue  # `redteam`: the suite only (the probes below were measured in session 9)
    timeout 60 python3 bench/worker/nvml_idle_probe.py --out "$OUT" > "$OUT/nvml.log" 2>&1; echo "nvml rc=$?"
    timeout 150 python3 bench/runtime/step_logits_check.py --shape 0.8b > "$OUT/step-logits-0.8b.json" 2>&1; echo "step rc=$?"
    tail -12 "$OUT/step-logits-0.8b.json" ;;
  calibrate|placebo|detect) cal "$step" ;;
  e2e)  # the worker reads the history `calibrate` left on this box (same card and protocol: no 15-min wait)
    [ -f /var/tmp/cal/history.sqlite ] && export TOKENGATE_AA_HISTORY=/var/tmp/cal/history.sqlite
    # --state: a second call while the box is warm runs only the cases without a verdict (one receipt)
    # E2E_ARGS: e.g. "--cases aa,decode_slow" (a session that calibrated first has ~12 min left for the cases)
    timeout $(( $(left) )) python3 -m bench.worker.gpu_e2e --out "$OUT" --state /var/tmp/e2e --budget-s $(( $(left) - 60 )) \
      ${E2E_ARGS:-} 2>&1 | tail -20 ;;
  dprofile)  # issue 17: where a decode token's time goes (4B at 0.185 of copy bandwidth, 9B short of 418 tok/s)
    timeout $(( $(left) )) python3 bench/profiling/decode_profile.py ${DPROFILE_ARGS:---shape 4b --shape 9b} --out "$OUT" \
      2>&1 | grep -v USDT | tail -22 ;;
  tiles)  # issue 17: 4B decode GEMVs on int8 x at BB=2 (K=2560 is 10 blocks: only BB=4/8 x8 tiles were swept,
          # gemv-sweep-4b-x8-20261201T1148Z.json) and its Q6_K LM head on int8 x; then decode.py end to end with the
          # swept table (graph == eager, fp32 reference check)
    sz=${TILES_SHAPE:-4b}; f=.cache/bench/qwen35-$sz-q4_k_m-seed0.gguf
    python3 -c "import sys; sys.path.insert(0, '.'); from bench.runtime.decode import make_model; from pathlib import Path; \
make_model('$sz', Path('.cache/bench'), 0)" || { echo "no $f"; continue; }
    timeout $(( $(left) * 1 / 2 )) python3 bench/profiling/gemv_sweep.py --gguf $f --out "$OUT" --reps 20 --configs \
      ${TILES_CONFIGS:-bytes_v2,words_16x2w2,words_16x2w4,x8_4x2w1,x8_4x2w2,x8_8x2w1,x8_8x2w2,x8_8x2w4,x8_16x2w2,x8_16x2w4,x8_32x2w4,x8_4x4w2,x8q6_4x2w1,x8q6_4x2w2,x8q6_8x2w1,x8q6_8x2w2,x8q6_16x2w4} \
      2>&1 | tail -12
    sw=$(ls "$OUT"/gemv-sweep-*$sz*.json 2>/dev/null | tail -1); [ -n "$sw" ] || continue
    timeout $(( $(left) )) python3 bench/runtime/decode.py --models $sz --gguf $sz=$f --depths ${TILES_DEPTHS:-0,16384} --runs 5 \
      --variants table,table_pdl --depth-variants table,table_pdl --check-variants table,table_pdl \
      --reference-shapes $sz --skip-checks --tile-table "$sw" --out "$OUT" 2>&1 | tail -14 ;;
  moeprofile)  # issue 17: where the MoE's pp512 goes (~44 ms of it does not grow with the prompt, 2026-12-06
               # receipts) and its new default decode token; the file made first if this box has none
    f=/var/tmp/moe/qwen35moe-35b-a3b-q4_k_m-seed0.gguf
    [ -f "$f" ] || timeout $(( $(left) - 200 )) python3 bench/runtime/moe.py --synth-only --out /var/tmp/moe-synth \
      --work /var/tmp/moe > "$OUT/moe-synth.log" 2>&1; [ -f "$f" ] || { tail -3 "$OUT/moe-synth.log"; continue; }
    for n in 512 4096; do
      timeout $(( $(left) / 2 )) python3 bench/profiling/prefill_profile.py --gguf "$f" --shape 35b-a3b --length $n \
        --out "$OUT" 2>&1 | tail -10
    done
    mkdir -p .cache/bench && ln -sf "$f" .cache/bench/qwen35-35b-a3b-q4_k_m-seed0.gguf
    timeout $(( $(left) )) python3 bench/profiling/decode_profile.py --shape 35b-a3b --out "$OUT" 2>&1 | grep -v USDT | tail -8 ;;
  profile)
    for shape in ${PROFILE_SHAPES:-0.8b 9b 27b}; do
      timeout $(( $(left) )) python3 bench/profiling/prefill_profile.py --shape $shape --quant q4_k_m --out "$OUT" 2>&1 | tail -10
    done ;;
  noise)  # issue 13: is the decode pair noise fresh processes or the per-step logits copy? (bench/worker/decode_noise.py)
    timeout $(( $(left) )) python3 bench/worker/decode_noise.py --out "$OUT" --model qwen35-9b-q4_k_m --pairs 6 --budget 170 \
      --model qwen35-0.8b-q8_0 2>&1 | tee "$OUT/noise.log" | grep -E "^pair|receipt|Error|error" ;;
  prefillcpu)  # issue 13: the 0.8B prefill 4k pair sd 11.4 % (gpu-calibration-standard-20261203T121536Z.json): CPU placement?
    timeout $(( $(left) )) python3 bench/worker/decode_noise.py --out "$OUT" --model qwen35-0.8b-q8_0 --variants cpus --prefill \
      --pairs 8 --budget 200 2>&1 | tee "$OUT/prefillcpu.log" | grep -E "^pair|receipt|Error|error" ;;
  graphs)  # issue 17: pp512-4k replayed from a CUDA graph (runtime/triton/prefill_graph.py, the default) vs eager,
            # with 4 decode steps after each compared
    timeout $(( $(left) )) python3 bench/runtime/prefill.py --models 0.8b,4b,9b --lengths 512,1024,4096 --gemm auto --graphs \
      --turn2 "" --check-models "" --out "$OUT" 2>&1 | tail -25 ;;
  llamacpp)  # issue 17: llama.cpp 3f545be built on the box from the carried .llama (bench/device/llama_src.py here),
             # run on the very files bench/runtime/prefill.py times, in this call: same-call pp512/pp4096 ratios
    [ -f .llama/CMakeLists.txt ] || { echo "no .llama: run bench/device/llama_src.py here and carry .llama"; continue; }
    shapes=${LLAMA_SHAPES:-0.8b,4b,9b}
    # LLAMA_MODE=decode: tg128 at depth 0 on both sides (decode.py's ratio column reads this call's receipt)
    lflags="-ngl 99 -fa 1 -p 512,4096 -n 0 -r 6"; [ "${LLAMA_MODE:-prefill}" = decode ] && lflags="-ngl 99 -fa 1 -p 0 -n 128 -r 5"
    # the files (.cache/bench) are made while llama-bench builds (CPU-bound, nothing is timed yet)
    python3 bench/runtime/prefill.py --models $shapes --lengths 512 --gemm auto --no-e2e --turn2 "" --check-models "" \
      --out /var/tmp/synth-only > "$OUT/synth.log" 2>&1 &
    synth=$!
    build_llama || continue
    wait $synth; echo "files made in $(( $(date +%s) - T0 )) s of the call"
    runs=""
    for sh in ${shapes//,/ }; do
      f=.cache/bench/qwen35-$sh-q4_k_m-seed0.gguf; [ -f "$f" ] || { echo "no $f"; continue; }
      timeout 120 $LB/bin/llama-bench -m "$f" $lflags -o json > "$OUT/llama-$sh.json" \
        2> "$OUT/llama-$sh-stderr.log"; runs="$runs $sh=$f:$OUT/llama-$sh.json"
    done
    python3 bench/llamacpp/llamacpp_receipt.py --llama-commit 3f545be --flags "llama-bench $lflags" --out "$OUT" $runs
    lr=$(ls "$OUT"/llamacpp-bench-*.json 2>/dev/null | tail -1)
    if [ "${LLAMA_MODE:-prefill}" = decode ]; then  # our tg128 on the same files, with the fp32-reference check
      timeout $(( $(left) )) python3 bench/runtime/decode.py --models $shapes --depths 0 --runs 5 --variants default \
        --reference-shapes $shapes ${lr:+--llama-cpp "$lr"} --out "$OUT" 2>&1 | tail -12
    else
      timeout $(( $(left) )) python3 bench/runtime/prefill.py --models $shapes --lengths 512,4096 --gemm auto \
        ${lr:+--llama-cpp "$lr"} --turn2 "" --check-models "" --out "$OUT" 2>&1 | tail -12
    fi ;;
  moetiles)  # issue 17: the MoE's dense GEMV shapes (K = 2048: 8 Q4_K blocks) were never swept; sweep them on its
             # file, time that table end to end (layer + fp32-reference checks), then profile the default token
    f=/var/tmp/moe/qwen35moe-35b-a3b-q4_k_m-seed0.gguf
    [ -f "$f" ] || timeout $(( $(left) - 240 )) python3 bench/runtime/moe.py --synth-only --out /var/tmp/moe-synth \
      --work /var/tmp/moe > "$OUT/moe-synth.log" 2>&1; echo "MoE file at $(( $(date +%s) - T0 )) s of the call"
    [ -f "$f" ] || { tail -3 "$OUT/moe-synth.log"; continue; }
    timeout $(( $(left) / 3 )) python3 bench/profiling/gemv_sweep.py --gguf "$f" --out "$OUT" --reps 20 --configs \
      ${TILES_CONFIGS:-bytes_v2,words_16x2w2,x8_4x2w1,x8_4x2w2,x8_8x2w1,x8_8x2w2,x8_16x2w2,x8_4x4w2,x8_8x4w2,x8q6_4x2w1,x8q6_4x2w2,x8q6_8x2w1,x8q6_8x2w2,x8q6_4x4w2} \
      2>&1 | tail -14
    sw=$(ls "$OUT"/gemv-sweep-*.json 2>/dev/null | head -1)
    timeout $(( $(left) - 100 )) python3 bench/runtime/moe.py --reuse --out "$OUT" --work /var/tmp/moe --runs 3 \
      --prefill 512 --variants "${sw:+$sw+default}" > "$OUT/moe.log" 2>&1; tail -${MOE_TAIL:-6} "$OUT/moe.log"
    [ "$(left)" -gt 90 ] || continue
    mkdir -p .cache/bench && ln -sf "$f" .cache/bench/qwen35-35b-a3b-q4_k_m-seed0.gguf
    timeout $(( $(left) )) python3 bench/profiling/decode_profile.py --shape 35b-a3b --out "$OUT" 2>&1 | grep -v USDT | tail -4 ;;
  experts)  # issue 17: the expert launches were 0.28-0.44 TB/s (decode-profile-35b-a3b-q4_k_m-h100-20261206T013633Z.json);
             # each tile checked against the twins (int8 x: exactly), then timed per launch over 16 layers' stacks
    # MOE_PREP=1: llama-bench built and the 35B-A3B file made meanwhile (CPU-bound, ~350 s; the sweep's times are
    # GPU-side graph replays), so that the next call on this warm box (`moe`) times both sides at once
    if [ "${MOE_PREP:-0}" = 1 ] && [ -f .llama/CMakeLists.txt ]; then
      (timeout $(( $(left) - 30 )) python3 bench/runtime/moe.py --synth-only --out /var/tmp/moe-synth --work /var/tmp/moe \
        > "$OUT/moe-synth.log" 2>&1 & build_llama; wait) & prep=$!
    fi
    timeout $(( $(left) )) python3 bench/profiling/expert_sweep.py --out "$OUT" ${EXPERT_ARGS:-} 2>&1 | tail -18
    [ -n "${prep:-}" ] && { wait $prep; echo "MoE file and llama-bench ready at $(( $(date +%s) - T0 )) s of the call"; } ;;
  grouped)  # issue 17: the MoE prefill's grouped-GEMM tiles on random stacks at the 35B-A3B's shapes (no file, ~1-2 min),
            # each checked against the twin, timed per layer from a CUDA graph at 512 and 4096 tokens
    timeout $(( $(left) )) python3 bench/profiling/grouped_sweep.py --out "$OUT" ${GROUPED_ARGS:-} 2>&1 | tail -12 ;;
  moe)  # issue 17: the MoE sibling (35B-A3B Q4_K_M) against llama.cpp on the same file in this call: our tg128 /
        # pp512 / pp4096 with kernel and layer checks (bench/runtime/moe.py, synthesis ~2 min while llama-bench builds)
    [ -f .llama/CMakeLists.txt ] || { echo "no .llama: run bench/device/llama_src.py here and carry .llama"; continue; }
    # the file is made while llama-bench builds (CPU-bound, nothing timed yet); both sides are timed after
    timeout $(( $(left) - 120 )) python3 bench/runtime/moe.py --synth-only --out /var/tmp/moe-synth --work /var/tmp/moe \
      > "$OUT/moe-synth.log" 2>&1 &
    synth=$!
    build_llama; wait $synth; echo "MoE file made in $(( $(date +%s) - T0 )) s of the call"
    f=$(ls /var/tmp/moe/qwen35moe-*.gguf 2>/dev/null | head -1); [ -n "$f" ] || { echo "no MoE file"; continue; }
    if [ -x $LB/bin/llama-bench ]; then  # llama.cpp first: the ratio's other side is in the receipt even if cut off
      timeout 150 $LB/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512,4096 -n 128 -r 5 -o json > "$OUT/llama-moe.json" \
        2> "$OUT/llama-moe-stderr.log"
      python3 bench/llamacpp/llamacpp_receipt.py --llama-commit 3f545be \
        --flags "llama-bench -ngl 99 -fa 1 -p 512,4096 -n 128 -r 5" --out "$OUT" 35b-a3b=$f:$OUT/llama-moe.json
    fi
    # ours: default, its fp32-reference KL (weights made on use), then the decode variants of MOE_VARIANTS (dense
    # GEMV tiles for the MoE's never-swept shapes, routed-expert tiles: 158.8 vs llama.cpp's 242.5 tok/s on an H100,
    # decode-profile-35b-a3b-q4_k_m-20261205T180558Z.json: expert GEMVs 4.0 of 6.3 ms at ~64-128 programs)
    timeout $(( $(left) - 20 )) python3 bench/runtime/moe.py --reuse --out "$OUT" --work /var/tmp/moe --runs 3 \
      --variants "${MOE_VARIANTS:-}" --prefill-variants "${MOE_PREFILL_VARIANTS:-}" > "$OUT/moe.log" 2>&1
    tail -${MOE_TAIL:-6} "$OUT/moe.log"
    [ "$(left)" -gt 90 ] || continue  # where a MoE decode token goes
    mkdir -p .cache/bench && ln -sf "$f" .cache/bench/qwen35-35b-a3b-q4_k_m-seed0.gguf
    timeout $(( $(left) )) python3 bench/profiling/decode_profile.py --shape 35b-a3b --out "$OUT" 2>&1 | grep -v USDT | tail -4 ;;
  gemm512)  # issue 17: pp512 is 90 % quantized GEMM (prefill-profile-9b-…-20261202T180009Z.json): tile vs scratch
    timeout $(( $(left) )) python3 bench/runtime/prefill.py --models 0.8b,4b,9b --lengths 512,1024 --gemm tile,scratch \
      --turn2 "" --check-models "" --out "$OUT" 2>&1 | tail -25 ;;
  longctx)  # issue 17 item 4: every position of a 32k and a 128k prompt, the serving path's last row, 64 decode
            # steps after it; the receipt is saved before and after each length, so a cut-off call says so
    # LONGCTX_ARGS="--logits-gb 20": the 32k rows in calls too, where one call's logits would not fit (9B, H100)
    timeout $(( $(left) )) python3 bench/runtime/long_context.py --models ${LONGCTX_MODELS:-9b} \
      --lengths 32768,131072 ${LONGCTX_ARGS:-} --out "$OUT" 2>&1 | tail -8 ;;
  refkl)  # issue 17 item 2: the fp32-reference KL of a size whose decode receipt ran without it (27B: its fp32
          # weights, 108 GB, are made on use beside the engine, bench/runtime/decode.py reference_weights)
    timeout $(( $(left) )) python3 bench/runtime/decode.py --models ${SIZE:-27b} --depths 0 --runs 3 \
      --skip-engine-variants --reference-shapes ${SIZE:-27b} --out "$OUT" 2>&1 | tail -8 ;;
  sizes)  # issue 17 item 2: one size per call (27B's synthesis alone takes minutes): decode tg128 @0/@16k with
          # its fp32-reference check, then prefill 512/4k/32k/128k with peak memory in what time is left
    sz=${SIZE:-2b}
    timeout $(( $(left) * 2 / 5 )) python3 bench/runtime/decode.py --models $sz --depths 0,16384 --runs 5 \
      --reference-shapes $sz --out "$OUT" 2>&1 | tail -8
    timeout $(( $(left) )) python3 bench/runtime/prefill.py --models $sz --lengths 512,4096,32768,131072 --gemm auto \
      --turn2 "" --check-models $sz --out "$OUT" 2>&1 | tail -10 ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
done
# At most 8 files come back: the logs travel as one archive beside the receipts.
(cd "$OUT" && ls *.log *.txt >/dev/null 2>&1 && tar czf logs.tgz *.log *.txt $(ls llama-*.json 2>/dev/null) \
   && rm -f *.log *.txt llama-*.json)
ls -la "$OUT"
