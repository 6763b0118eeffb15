#!/usr/bin/env bash
# Issue 31's GPU measurements, in three device calls of under 600 s each (a call's limit): every figure lands
# under $OUT.
#   bash benchmarks/issue31_gpu.sh parts     # the round split (NWC too), bounded context, the HTTP host cost
#   bash benchmarks/issue31_gpu.sh levers    # the voicing's speed levers (benchmarks/acoustic_levers.py)
#   bash benchmarks/issue31_gpu.sh product   # the product path, benchmarks/product_load.py (~570 s)
#   bash benchmarks/issue31_gpu.sh compile   # the round with and without the compiled voicing, a shorter product path
#   bash benchmarks/issue31_gpu.sh compiled_round                 # next: the compiled round given its capture time
#   bash benchmarks/issue31_gpu.sh product_compiled|product_plain  # next: the product path A/B (two calls)
#   bash benchmarks/issue31_gpu.sh pipeline   # acoustic_pipeline on (1, 64, 256 clients) and off (64, 256)
#   bash benchmarks/issue31_gpu.sh prefill    # prefill_wait_ms 50 (1, 64, 256 clients) and 0 (64, 256)
#   bash benchmarks/issue31_gpu.sh attention  # SDPA first calls per backend, a prefill's split (prefill_split.py);
#                                             # the product with cuDNN attention off/on
#   bash benchmarks/issue31_gpu.sh prefill_graphs  # captured prefills: their split, the product with them on/off
#   bash benchmarks/issue31_gpu.sh cache      # the product at 1-700 clients; the reference cache at 1,024 against 64
#   bash benchmarks/issue31_gpu.sh references  # the product with 16 reference threads against 2 (the default)
#   bash benchmarks/issue31_gpu.sh reference_split  # next: a new clip's preparation, stage by stage, under bursts
#   bash benchmarks/issue31_gpu.sh gil        # next: the GIL switch interval 0.5 ms against Python's 5 ms, product
# At most 8 files come back from a call: each mode writes fewer.
# Run from the repository root on the device machine, after the wheels and dictionary are in place
# (docs/benchmarks.md, "Device command"): the acoustic round's split (graphs and eager), bounded-context
# streaming against the official decode, the HTTP server's own CPU cost on this host, then the product path.
# Each step has its own time limit so that a slow one cannot take the others' time; a step that fails is
# named in $OUT/steps.log and the next one runs.
set -u
OUT=${OUT:?set OUT to the folder that comes back}
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/steps.log"
echo "ulimit -n $(ulimit -n)" | tee -a "$OUT/steps.log"
if [ "${1:-parts}" = product ]; then
  step product_load 570 python3 benchmarks/product_load.py --ref-dir .gpu/refset --gsv off --out "$OUT/product"
  exit 0
fi
if [ "${1:-parts}" = compile ]; then  # serving's compiled voicing (acoustic_compile) before/after, then the product
  step round_split_graphs 90 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 --rows 64 \
    --graphs --rounds 20
  step round_split_compiled 160 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 \
    --rows 64 --graphs --compile --rounds 20
  step product_load 300 python3 benchmarks/product_load.py --ref-dir .gpu/refset --gsv off --levels 1,16,64,256 \
    --duration 10 --budget 290 --out "$OUT/product"
  exit 0
fi
if [ "${1:-parts}" = compiled_round ]; then  # the compiled voicing's round (its captures take ~140 s on an H200)
  step round_split_compiled 420 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 \
    --rows 64,256 --graphs --compile --rounds 20
  step round_split_graphs 120 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 \
    --rows 64,256 --graphs --rounds 20
  exit 0
fi
if [ "${1:-parts}" = product_compiled ] || [ "${1:-parts}" = product_plain ]; then  # the A/B under load, one call
  flag=--no-acoustic-compile; [ "$1" = product_compiled ] && flag=--acoustic-compile  # each; the same machine
  step product_load 570 python3 benchmarks/product_load.py --ref-dir .gpu/refset --gsv off --levels 1,64,256 \
    --duration 15 --budget 560 --serve-arg=$flag --out "$OUT/product"
  exit 0
fi
product() {  # product NAME LEVELS [product_load flags...]: the product path (8 s levels) into $OUT/NAME.{json,md}
  local name=$1 levels=$2
  shift 2
  timeout 270 python3 benchmarks/product_load.py --ref-dir .gpu/refset --gsv off --levels "$levels" --duration 8 \
    --timeout 45 --budget 260 --out "/tmp/$name" "$@" >"/tmp/$name.txt" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/steps.log"
  cp "/tmp/$name/product_load.json" "$OUT/$name.json"
  cp "/tmp/$name/product_load.md" "$OUT/$name.md"
  { echo "-- $name.txt (tail)"; tail -n 12 "/tmp/$name.txt"
    echo "-- server.log: $(grep -c Traceback "/tmp/$name/server.log") tracebacks (tail)"
    grep -v '" 200 OK\|synthesis mode' "/tmp/$name/server.log" | tail -n 15; } >>"$OUT/steps.log" 2>&1
}
if [ "${1:-parts}" = pipeline ]; then  # acoustic_pipeline on/off: the product path with the engine's own figures
  product product_on 1,64,256 --serve-arg=--acoustic-pipeline
  product product_off 64,256 --serve-arg=--no-acoustic-pipeline
  exit 0
fi
if [ "${1:-parts}" = prefill ]; then  # prefill_wait_ms 50 (default) against 0: the product path, engine figures
  product product_wait50 1,64,256 --serve-arg=--prefill-wait-ms=50
  product product_wait0 64,256 --serve-arg=--prefill-wait-ms=0
  exit 0
fi
if [ "${1:-parts}" = attention ]; then  # cuDNN's attention off (default now) against on: the prefill's cost
  step prefill_shapes 60 python3 benchmarks/prefill_shapes.py
  step prefill_split 120 python3 benchmarks/prefill_split.py
  SOVITS_CUDNN_ATTENTION=0 product product_cudnn0 1,64,256
  SOVITS_CUDNN_ATTENTION=1 product product_cudnn1 1,64,256  # keeps cuDNN's attention (the former behaviour)
  exit 0
fi
if [ "${1:-parts}" = prefill_graphs ]; then  # captured prefills (default now) against eager ones
  step prefill_split 150 python3 benchmarks/prefill_split.py
  product product_pfgraphs 1,64,256 --serve-arg=--prefill-graphs
  product product_pfeager 64,256 --serve-arg=--no-prefill-graphs
  exit 0
fi
if [ "${1:-parts}" = cache ]; then  # the reference cache's entries 1,024 (default now) against 64 (the former)
  product product_default 1,64,256,700
  product product_cache64 64,256 --serve-arg=--reference-cache-entries=64
  exit 0
fi
if [ "${1:-parts}" = references ]; then  # reference_threads 16 against 2 (the default; was made 16 for this run)
  product product_ref16 1,64,256 --serve-arg=--reference-threads=16
  product product_ref2 64,256 --serve-arg=--reference-threads=2
  product product_ref16_text6 64,256 --serve-arg=--reference-threads=16 --serve-arg=--text-processes=6
  exit 0
fi
if [ "${1:-parts}" = reference_split ]; then  # where a new clip's preparation goes (benchmarks/reference_split.py)
  for v in "2 -1" "16 -1" "16 6"; do  # reference threads, text processes (-1: auto, 2 on CUDA)
    set -- $v
    step "reference_split_t$1_p$2" 150 python3 benchmarks/reference_split.py --ref-dir .gpu/refset \
      --bursts 1,16,64,256 --reference-threads "$1" --text-processes "$2" --json "$OUT/reference_split_t$1_p$2.json"
  done
  exit 0
fi
if [ "${1:-parts}" = gil ]; then  # switch_interval_ms 0.5 against Python's own 5 ms (the default, 0)
  step gil_handoff 60 python3 benchmarks/gil_handoff.py
  product product_gil5 1,64,256
  product product_gil05 1,64,256 --serve-arg=--switch-interval-ms=0.5
  exit 0
fi
if [ "${1:-parts}" = levers ]; then
  step levers 170 python3 benchmarks/acoustic_levers.py --device cuda --rows 32,64 --json "$OUT/levers.json" \
    --levers fp32,fp16,bf16,fp16-graph,bf16-graph,fp16-nwc,fp16-nwc-graph,bf16-nwc-graph
  step levers_compile 170 python3 benchmarks/acoustic_levers.py --device cuda --rows 64 \
    --levers fp16-graph,fp16-compile,fp16-nwc-compile --json "$OUT/levers_compile.json"
  step levers_autotune 200 python3 benchmarks/acoustic_levers.py --device cuda --rows 64 --levers fp16-compile \
    --compile-mode max-autotune-no-cudagraphs --json "$OUT/levers_autotune.json"
  exit 0
fi
step round_split 150 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 --rows 64,256 \
  --graphs --rounds 20 --json "$OUT/round_split.json"
step round_split_nwc 110 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 \
  --rows 64,256 --graphs --nwc --rounds 20 --json "$OUT/round_split_nwc.json"
step round_split_eager 60 python3 benchmarks/acoustic_round_split.py --device cuda --precision fp16 --rows 64 \
  --rounds 10
step stream_context 50 python3 benchmarks/stream_context.py --device cuda --precision fp16 --tokens 200 \
  --contexts 0,32,64,128
[ "${SKIP_HOST_COST:-}" ] || step http_host_cost 80 python3 benchmarks/http_host_cost.py --levels 1,64,256 --duration 8 --front-end \
  --ref-dir .gpu/refset
