#!/usr/bin/env bash
# The GPU runs, one command per device call (the device has no network: diffusers 0.37.1, libcst, msgspec and
# importlib_metadata travel as wheels in .whl/). Usage on the GPU machine, from the repository root:
#   LAB_COMMIT=<sha> bash benchmarks/gpu_campaign.sh PART
# PART 1: every scenario at full size (results/scenarios.md) and the first A/B run; PARTS 2 to 5: the other A/B runs;
# PART 6: the GPU sync hunts (before/after all fixes) and the unipc_host_coeffs A/B; PART 7: sweeps and the
# hunts again with the debug-mode attribution fixed; PARTS 8 to 10: LTX2, a compile-mode A/B, the eager hook cache.
# PART 11: the GPU runs of wan_v2v and ltx2_i2v and eager pairs; PART 12: regional-compile pairs; PART 13: LTX2
# compiled and the GPU calibration; PARTS 14 to 17: the Flux2 eager sets, the hook cache across compile modes, plain
# Qwen-Image, LTX2 and Wan one fix at a time; PARTS 18 to 25: LTX2 again with mirrored calls and under compile,
# plain Qwen-Image under compile (again with a warm-up call after part 21 drifted), the sweeps for the fixes not
# swept yet, all fixes on wan_v2v and ltx2_i2v, and plain Qwen-Image with all 60 blocks; PARTS 26 to 30: the UniPC sweeps, the conditioning scenarios
# one fix at a time, the hook cache under CUDA graphs (whole-transformer compile), begin_index swept under compile,
# Wan with all 40 blocks, the hook cache on Qwen-Image's 60 blocks; PART 31: part 28's whole-transformer sweep again;
# PART 32: Wan with all 40 blocks, 6 timing blocks.
# Logs go to results/logs/ through benchmarks/strip_progress.py.
# What it writes under results/ (only that: the files this run created or changed) comes back as
# $OUT/results-PART.tgz, to unpack in the repository root; logs as $OUT/campaign-PART.log.
set -uo pipefail
part=${1:?part}
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee "$out/campaign-$part.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, diffusers, transformers, libcst; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
# only files newer than the start: a whole results/ would carry the copy's old versions of files that another part,
# run before this copy was merged, has since replaced (parts 23 and 24 did that to each other)
started=$(mktemp)
snapshot() {
  find results -type f -newer "$started" -print0 | tar czf "$out/results-$part.tgz.tmp" --null -T - &&
    mv "$out/results-$part.tgz.tmp" "$out/results-$part.tgz"
}
# every 15 s as well as after each command: one command can write several results (`--fix each`), and a time-out
# kills it before the next snapshot (parts 12 and 13 lost a finished Flux2 result that way)
( while sleep 15 && kill -0 $$ 2>/dev/null; do snapshot; done ) >/dev/null 2>&1 &
saver=$!
# `within SECONDS COMMAND..`: run the command only if its estimated time ends within the call's limit (LAB_PART_S,
# default 570 s, set-up included); one that does not fit is logged as skipped, for a later part
within() {
  local need=$1; shift
  if (( SECONDS + need > ${LAB_PART_S:-570} )); then echo "+ skipped (needs ~$need s, $SECONDS s used): $*"; return 1; fi
  "$@"
}
lab() {
  echo "+ lab $*"; /usr/bin/time -f "  [%e s]" python3 -m lab.cli "$@"; echo "  [exit $?]"
  snapshot
}

case "$part" in
1)
  # smoke test of the CUDA paths on a tiny model first (seconds)
  lab ab --fix unipc_stack --pipeline wan --size tiny --device cuda --blocks 6 --repeat 1 --out /tmp/smoke --replace
  python3 benchmarks/scenarios_report.py
  lab ab --fix flux2_unpack_hw --pipeline flux2 --size full --blocks 8 --repeat 1 --warmup 0 --replace
  ;;
2)
  lab ab --fix unipc_stack,unipc_device_const --pipeline wan --size full --layers 4 --blocks 8 --repeat 1 --warmup 0 --replace
  lab ab --fix qwen_modulate_index --pipeline qwenimage_zero_cond --size full --layers 8 --blocks 8 --repeat 1 --warmup 0 --replace
  lab ab --fix hook_registry_cache --pipeline flux2 --size full --mode compile --steps 2 --blocks 10 --repeat 1 --warmup 0 --replace
  ;;
3)
  # rerun with the counterbalanced order (part 2's shuffle put control first in 8 of 10 blocks)
  lab ab --fix hook_registry_cache --pipeline flux2 --size full --mode compile --steps 2 --blocks 10 --repeat 1 --warmup 0 --replace
  lab ab --fix begin_index --pipeline wan --size full --layers 4 --mode compile --blocks 8 --repeat 1 --warmup 0 --replace
  lab ab --fix no_progress_bar --pipeline flux --size full --blocks 8 --repeat 1 --warmup 0 --replace
  lab ab --fix all --pipeline wan --size full --layers 4 --blocks 8 --repeat 1 --warmup 0 --replace
  ;;
4)
  # the guide's headline (hook cache, Klein, regional compile, 2 steps) with alternating calls to cancel the order
  # effect; then the guide's Wan claim at full size (40 blocks): the profile pair and one block only
  lab ab --fix hook_registry_cache --pipeline flux2 --size full --mode compile --steps 2 --blocks 8 --repeat 2 --warmup 0 --replace
  lab ab --fix begin_index --pipeline wan --size full --mode compile --blocks 1 --repeat 1 --warmup 0 --replace
  ;;
5)
  # part 4's hook-cache run alternated C T C T, which put test on every slow second call; now mirrored C T T C
  lab ab --fix hook_registry_cache --pipeline flux2 --size full --mode compile --steps 2 --blocks 8 --repeat 2 --warmup 0 --replace
  ;;
6)
  # the sync hunter on the GPU: each pipeline hunted without and with all its fixes (one build each), then the
  # new UniPC fix timed
  lab hunt --pipeline wan --size tiny --device cuda --fix all --baseline --out /tmp/smoke --replace
  lab hunt --pipeline wan --size full --layers 4 --fix all --baseline --replace
  lab ab --fix unipc_host_coeffs --pipeline wan --size full --layers 4 --blocks 8 --repeat 1 --warmup 0 --replace
  for p in ltx2 flux2 flux qwenimage_zero_cond qwenimage; do lab hunt --pipeline $p --size full --fix all --baseline --replace; done
  ;;
7)
  # part 6's debug-mode lines were attributed to warnings.py (fixed): Wan again, plain Qwen-Image (cut off by the
  # time limit); then where the hook cache and the host-side UniPC coefficients matter; then LTX2 with all its fixes
  lab hunt --pipeline wan --size full --layers 4 --fix all --baseline --replace
  lab hunt --pipeline qwenimage --size full --fix all --baseline --replace
  lab sweep --fix hook_registry_cache --pipeline flux2 --size full --vary size=256,512,1024 --blocks 6 --repeat 2 --warmup 0 --no-profile --replace
  lab sweep --fix unipc_host_coeffs --pipeline wan --size full --layers 4 --vary frames=5,21,81 --blocks 6 --repeat 1 --warmup 0 --no-profile --replace
  lab ab --fix all --pipeline ltx2 --size full --blocks 8 --repeat 1 --warmup 0 --replace  # cut off by the time limit
  ;;
8)
  # part 7's LTX2 run again, smaller, then the last minutes of the session's device time
  lab ab --fix all --pipeline ltx2 --size full --blocks 6 --repeat 1 --warmup 0 --replace
  ;;
9)
  lab ab --fix qwen_modulate_index --pipeline qwenimage_zero_cond --size full --layers 8 --mode compile --blocks 6 --repeat 1 --warmup 0 --replace
  ;;
10)
  lab ab --fix hook_registry_cache --pipeline flux2 --size full --blocks 8 --repeat 1 --warmup 0 --replace
  ;;
11)
  # the new begin_index sites on the GPU (the LTX2 image-to-video call with 8 of its 48 blocks: the fix is in the
  # scheduler loop, and shorter calls show it better); then eager pairs not run yet: with `--fix each`, every fix
  # alone and all together on one build (results that exist are kept)
  lab hunt --pipeline wan_v2v --size full --layers 4 --fix all --baseline --replace
  lab ab --fix begin_index --pipeline wan_v2v --size full --layers 4 --blocks 6 --repeat 1 --warmup 0 --replace
  lab hunt --pipeline ltx2_i2v --size full --layers 8 --fix all --baseline --replace
  lab ab --fix begin_index --pipeline ltx2_i2v --size full --layers 8 --blocks 8 --repeat 1 --warmup 0 --replace
  lab ab --fix each --pipeline qwenimage_zero_cond --size full --layers 8 --blocks 8 --repeat 1 --warmup 0
  lab ab --fix each --pipeline flux --size full --blocks 8 --repeat 1 --warmup 0
  ;;
12)
  # regional compile for the Flux, Flux2 and Qwen-Image pairs (one build and one compilation per pipeline), then
  # the Flux2 eager pairs not run yet
  lab ab --fix each --pipeline flux2 --size full --mode compile --blocks 8 --repeat 1 --warmup 0
  lab ab --fix each --pipeline flux --size full --mode compile --blocks 6 --repeat 2 --warmup 0  # part 11: period-2 pattern
  lab ab --fix each --pipeline qwenimage_zero_cond --size full --layers 8 --mode compile --blocks 8 --repeat 1 --warmup 0
  lab ab --fix each --pipeline flux2 --size full --blocks 8 --repeat 1 --warmup 0
  ;;
13)
  # LTX2 under compile, the engine's false-positive rate and power on the GPU, and the hook cache across compile
  # modes including CUDA graphs (reduce-overhead)
  lab ab --fix all --pipeline ltx2 --size full --mode compile --blocks 6 --repeat 1 --warmup 0 --replace
  lab calibrate --pipeline qwenimage_zero_cond --size full --layers 8 --trials 16 --blocks 8 --repeat 1 --warmup 0 --stall-ms 1 --replace
  lab ab --fix each --pipeline flux2 --size full --blocks 8 --repeat 1 --warmup 0  # part 12's last set, cut off
  ;;
14)
  # the two Flux2 eager sets whose JSON a time limit cut off, then the hook cache under both compile modes,
  # CUDA graphs (reduce-overhead) included (the eager point is the eager A/B above)
  lab ab --fix each --pipeline flux2 --size full --blocks 8 --repeat 1 --warmup 0
  lab sweep --fix hook_registry_cache --pipeline flux2 --size full --vary compile=default,reduce-overhead --blocks 6 --repeat 2 --warmup 0 --no-profile --replace
  ;;
15)
  # what the coverage table of results/README.md shows as "not run": plain Qwen-Image, then Wan one fix at a time
  # (one build per pipeline; a 2.9 s Wan call affords 6 blocks and one profiled call per arm)
  lab ab --fix each --pipeline qwenimage --size full --layers 8 --blocks 8 --repeat 1 --warmup 0
  lab ab --fix each --pipeline wan --size full --layers 4 --blocks 6 --repeat 1 --warmup 0 --profile-calls 1
  ;;
16)
  lab ab --fix each --pipeline ltx2 --size full --layers 8 --blocks 8 --repeat 1 --warmup 0
  lab ab --fix each --pipeline wan --size full --layers 4 --mode compile --blocks 6 --repeat 1 --warmup 0 --profile-calls 1
  ;;
17)
  # part 16's Wan sets that its time limit cut off (the finished ones are kept)
  lab ab --fix each --pipeline wan --size full --layers 4 --mode compile --blocks 6 --repeat 1 --warmup 0 --profile-calls 1
  ;;
18)
  # LTX2 at 8 blocks again with mirrored calls (part 16 saw a 3.8 % order effect at --repeat 1), then plain
  # Qwen-Image under compile
  lab ab --fix each --pipeline ltx2 --size full --layers 8 --blocks 8 --repeat 2 --warmup 0 --replace
  within 240 lab ab --fix each --pipeline qwenimage --size full --layers 8 --mode compile --blocks 8 --repeat 1 --warmup 0
  ;;
19)
  # LTX2 one fix at a time under compile; then where each fix not swept yet matters (no profiles: the A/B pages
  # have them), on the pipeline it matters most for
  lab ab --fix each --pipeline ltx2 --size full --layers 8 --mode compile --blocks 8 --repeat 2 --warmup 0
  within 60 lab sweep --fix qwen_modulate_index --pipeline qwenimage_zero_cond --size full --layers 8 --vary size=512,1024 --blocks 8 --repeat 2 --warmup 0 --no-profile --replace
  within 130 lab sweep --fix flux2_unpack_hw --pipeline flux2 --size full --vary size=256,512,1024 --blocks 8 --repeat 2 --warmup 0 --no-profile --replace
  ;;
20)
  # the sweeps part 19 had no time for, more blocks where the UniPC fix looked larger (short Wan calls), and the
  # cheap sets: all fixes on the two conditioning scenarios, and plain Qwen-Image with all 60 blocks
  within 130 lab sweep --fix no_progress_bar --pipeline flux2 --size full --vary size=256,512,1024 --blocks 8 --repeat 2 --warmup 0 --no-profile --replace
  within 160 lab sweep --fix begin_index --pipeline wan --size full --layers 4 --vary frames=5,21,81 --blocks 8 --repeat 2 --warmup 0 --no-profile --replace
  within 80 lab sweep --fix unipc_host_coeffs --pipeline wan --size full --layers 4 --vary frames=5,21 --blocks 16 --repeat 2 --warmup 0 --no-profile --name unipc_host_coeffs__frames-short__eager__full-4l__h200 --replace
  within 60 lab ab --fix all --pipeline wan_v2v --size full --layers 4 --blocks 8 --repeat 2 --warmup 0 --replace
  within 70 lab ab --fix all --pipeline ltx2_i2v --size full --layers 8 --blocks 8 --repeat 2 --warmup 0 --replace
  within 100 lab ab --fix all --pipeline qwenimage --size full --blocks 8 --repeat 1 --warmup 0 --replace
  ;;
21)
  # the last minutes of a machine's 30 held minutes: plain Qwen-Image under compile (skipped in part 18)
  within 240 lab ab --fix each --pipeline qwenimage --size full --layers 8 --mode compile --blocks 8 --repeat 1 --warmup 0
  ;;
22)
  # all fixes on the LTX2 image-to-video call (part 20 ran out of time: its estimate for the Wan video-to-video
  # command assumed a 0.2 s call, and the call takes 4.4 s)
  lab ab --fix all --pipeline ltx2_i2v --size full --layers 8 --blocks 8 --repeat 2 --warmup 0 --replace
  ;;
23)
  # plain Qwen-Image under compile again with a warm-up call per switch and more blocks: part 21's first set (the hook
  # cache) drifted (control 181 -> 155 ms over its 8 blocks right after compiling, Spearman p = 0.002); then LTX2
  # with all its fixes, eager, with twice the blocks (8 blocks gave a CI of +-2 %); then the Wan video-to-video call
  lab ab --fix each --pipeline qwenimage --size full --layers 8 --mode compile --blocks 12 --repeat 2 --warmup 1 --replace
  within 120 lab ab --fix all --pipeline ltx2 --size full --layers 8 --blocks 16 --repeat 2 --warmup 0 --replace
  within 160 lab ab --fix all --pipeline wan_v2v --size full --layers 4 --blocks 8 --repeat 1 --warmup 0 --replace
  ;;
24)
  # all fixes under compile on the two conditioning scenarios, and plain Qwen-Image with all 60 blocks
  within 150 lab ab --fix all --pipeline ltx2_i2v --size full --layers 8 --mode compile --blocks 8 --repeat 2 --warmup 0 --replace
  within 200 lab ab --fix all --pipeline qwenimage --size full --blocks 8 --repeat 1 --warmup 0 --replace
  within 200 lab ab --fix all --pipeline wan_v2v --size full --layers 4 --mode compile --blocks 6 --repeat 1 --warmup 0 --replace
  ;;
25)
  # part 24's 60-block Qwen-Image call was host-bound and noisy (control CV 19 %): again with a warm-up call per
  # switch and more blocks, then the hook cache alone
  lab ab --fix all --pipeline qwenimage --size full --blocks 12 --repeat 2 --warmup 1 --replace
  within 230 lab ab --fix hook_registry_cache --pipeline qwenimage --size full --blocks 12 --repeat 2 --warmup 1 --replace
  ;;
26)
  # the two UniPC fixes not swept (short Wan calls, where unipc_host_coeffs matters), then the
  # LTX2 image-to-video fixes one at a time (results that exist are kept)
  within 90 lab sweep --fix unipc_stack --pipeline wan --size full --layers 4 --vary frames=5,21 --blocks 16 --repeat 2 --warmup 0 --no-profile --replace
  within 90 lab sweep --fix unipc_device_const --pipeline wan --size full --layers 4 --vary frames=5,21 --blocks 16 --repeat 2 --warmup 0 --no-profile --replace
  within 160 lab ab --fix each --pipeline ltx2_i2v --size full --layers 8 --blocks 8 --repeat 2 --warmup 0
  ;;
27)
  # the Wan video-to-video fixes one at a time (a 4.4 s call: 6 blocks, one profiled call per arm)
  lab ab --fix each --pipeline wan_v2v --size full --layers 4 --blocks 6 --repeat 1 --warmup 0 --profile-calls 1
  ;;
28)
  # the hook cache under CUDA graphs with the whole transformer compiled (regional compile cannot run
  # reduce-overhead, part 14), then the guide's Wan claim swept over frames under regional compile
  within 300 lab sweep --fix hook_registry_cache --pipeline flux2 --size full --no-compile-regional --vary compile=default,reduce-overhead --blocks 6 --repeat 2 --warmup 1 --no-profile --name hook_registry_cache__compile-whole__full__h200 --replace
  within 240 lab sweep --fix begin_index --pipeline wan --size full --layers 4 --mode compile --vary frames=5,21,81 --blocks 8 --repeat 2 --warmup 0 --no-profile --replace
  ;;
29)
  # Wan with all 40 blocks, all fixes, eager: a 23 s call, so 5 blocks of one call per arm and one profiled call
  lab ab --fix all --pipeline wan --size full --blocks 5 --repeat 1 --warmup 0 --profile-calls 1 --replace
  ;;
30)
  # the hook cache alone on plain Qwen-Image with all 60 blocks (part 25 had no time left for it)
  lab ab --fix hook_registry_cache --pipeline qwenimage --size full --blocks 12 --repeat 2 --warmup 1 --replace
  ;;
31)
  # part 28's whole-transformer sweep again: both points had failed, `default` because nn.Module.compile traced the
  # lab's step marks (now the forward is compiled under them), `reduce-overhead` because Klein reads its first
  # guidance call's output after the second replay (now cloned, as torch advises)
  lab sweep --fix hook_registry_cache --pipeline flux2 --size full --no-compile-regional --vary compile=default,reduce-overhead --blocks 6 --repeat 2 --warmup 1 --no-profile --name hook_registry_cache__compile-whole__full__h200 --replace
  ;;
32)
  # part 29's 5 blocks cannot give p < 0.05: Wan with all 40 blocks again, 6 blocks, no profile (part 29 has the pair)
  lab ab --fix all --pipeline wan --size full --blocks 6 --repeat 1 --warmup 0 --no-profile --name begin_index+hook_registry_cache+no_progress_bar+unipc_device_const+unipc_host_coeffs__eager__full-6blocks__h200 --replace
  ;;
esac
kill $saver
snapshot
echo "done part $part"
