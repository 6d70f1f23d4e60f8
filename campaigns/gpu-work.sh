#!/usr/bin/env bash
# The lab's measurements on a lent GPU host, part by part: the GPU's own ceilings, the A/Bs of upstream's GPU-side
# changes given as diffs, the census of the newest release with the device work and the GPU-side waste, the A/Bs of
# the catalog's fixes for what the hunt found, the calibration of the trace's bound, and the settings maps (which
# setting to run for a memory budget). Each argument names a part, run in the order given:
#   LAB_COMMIT=<git rev-parse --short HEAD> LEFT=540 PACK=w1 bash campaigns/gpu-work.sh peaks patches census
#   LAB_COMMIT=... LEFT=570 PACK=w5 bash campaigns/gpu-work.sh owed-ltx2      (then owed-sana-wan in a second call)
#   LAB_COMMIT=... LEFT=560 PACK=b1 MAPS="flux2 flux" bash campaigns/gpu-work.sh bound settings-map
#   (MAP_HOST_TRACE=1: `lab settings --host-trace`, what the host did while the device sat idle)
#   LAB_COMMIT=... LEFT=470 PACK=u2 bash campaigns/gpu-work.sh upstream   (carrying .site/lab.tar.xz and .releases)
# The host lacks the lab's dependencies: carry .site/lab.tar.xz (libcst, msgspec, tabulate, pytest and what diffusers'
# tests import) and .site/models.tar.xz (diffusers 0.37.1, peft, accelerate), unpacked and packed as
# campaigns/device.sh's header says, and for the upstream part .releases/: the accelerate 1.15.0 wheel, the diffusers
# 0.42.1 one unpacked and xz-packed (<wheel>.whl.tar.xz), and the suites' tarball. A call carries what its parts need:
# the working tree and the carried paths must stay under the device's 64 MiB.
# LEFT: seconds from the start by which the last part must end (each part gets what is left, and a census is stopped
# with a Ctrl-C so that it keeps the pipelines it completed). What the parts wrote under results/ is packed into
# $OUT/PACK.tgz (files come back only with plain names), the census traces of SD3.5 and Z-Image into $OUT/PACK-traces.tgz,
# the settings maps' profiled calls into $OUT/PACK-maps.tar, and every line the lab printed into $OUT/PACK-lab.log.
set -uo pipefail
start=$(date +%s)
site=${SITE:-/tmp/site}
mkdir -p "$site"
for packed in .site/*.tar.xz; do  # the lab's own dependencies, and the models' (diffusers 0.37.1, peft, accelerate)
  [ -f "$packed" ] && { tar xJf "$packed" -C "$site" --strip-components=1 || { echo "gpu-work.sh: $packed"; exit 2; }; }
done
# a release wheel carried unpacked and xz-packed (a third of its size) is zipped again, as the lab reads wheels
wheels=$(mktemp -d)
for packed in .releases/*.whl.tar.xz; do
  [ -f "$packed" ] || continue
  name=$(basename "$packed" .tar.xz) && mkdir "$wheels/$name.d" && tar xJf "$packed" -C "$wheels/$name.d" &&
    (cd "$wheels/$name.d" && python3 -m zipfile -c "../$name" *) || { echo "gpu-work.sh: $packed"; exit 2; }
done
export PYTHONPATH=$site PYTHONUNBUFFERED=1 LAB_WHEELS=$wheels:$PWD/.releases
out=${OUT:-.}
pack=${PACK:-gpu-work}
marker=$(mktemp)
left() { echo $(( ${LEFT:-540} - ($(date +%s) - start) )); }
lab() {
  local t=$(( $(left) - 25 ))
  [ "$t" -gt 20 ] || { echo "gpu-work.sh: no time left for lab $1 $*"; return; }
  timeout --signal=INT --kill-after=20 "$t" python3 -m lab "$@" 2>&1 | grep -v '^\s*$' | tee -a "$out/$pack-lab.log" |
    tail -12
}
# RESUME=1: an A/B goes on from the blocks (and profiles) a result already holds (`lab ab --resume`)
ab() { lab ab --size full --layers 4 --out results/ab --trace-dir traces ${RESUME:+--resume} "$@"; }
for part in "$@"; do
  [ "$(left)" -gt 60 ] || { echo "== $part: no time left"; continue; }
  echo "== $part ($(left) s left)"
  case $part in
    peaks) python3 benchmarks/gpu_peaks.py ;;
    patches)  # upstream #14186 (SD3.5) and #12955 (Z-Image) as diffs against 0.37.1, eager, then compiled
      ab --patch patches/changes/sd3_contiguous.diff --pipeline sd35 --budget 75s
      ab --patch patches/changes/zimage_mask_none.diff --pipeline zimage --budget 75s ;;
    patches-compiled)  # SD3's transformer names no repeated blocks: compiled whole, as its users compile it
      ab --patch patches/changes/sd3_contiguous.diff --pipeline sd35 --budget 75s --mode compile --no-compile-regional
      ab --patch patches/changes/zimage_mask_none.diff --pipeline zimage --budget 75s --mode compile ;;
    census)  # the newest release, true per-layer shapes, 2 blocks: device work, waste, and the fixes' ends
      lab census --size full --layers 2 --arms ends --diffusers 0.42.1 --out results/census --trace-dir traces \
        ${CENSUS_PIPELINES:+--pipeline $CENSUS_PIPELINES} ;;
    fixes)  # the catalog's fixes for the GPU-side waste, eager and compiled
      for fix in ${FIXES:-}; do
        IFS=: read -r name pipeline <<< "$fix"
        ab --fix "$name" --pipeline "$pipeline" --budget "${FIX_BUDGET:-60s}"
        # a transformer that names no repeated blocks is compiled whole, as its users compile it
        whole=$(case $pipeline in sd35|sana|cogvideox|lumina2|mochi|auraflow|cosmos2) echo --no-compile-regional;; esac)
        ab --fix "$name" --pipeline "$pipeline" --budget "${FIX_BUDGET:-60s}" --mode compile $whole
      done ;;
    owed-ltx2)  # cells a 40-block design left undecided, again with the blocks their own estimate asked for
      ab --fix ltx2_mask_none --pipeline ltx2 --budget 4m --max-blocks 120 --replace
      ab --fix ltx2_mask_none --pipeline ltx2 --budget 3m --max-blocks 120 --replace --mode compile ;;
    owed-sana-wan)  # Sana eager likewise; Wan's compiled unipc_stack cell, once refused as "outputs differ"
      ab --fix contiguous_before_blocks --pipeline sana --budget 4m --max-blocks 300 --replace
      ab --fix unipc_stack --pipeline wan --budget 3m --mode compile --replace ;;
    keep-host-follow)  # group_offload_keep_host's kept tensors follow a cast: checked with real streams and pinned
      # memory, and its Wan cell measured again with the check it adds to every onload
      python3 benchmarks/offload_cast.py --out results/offload_cast.json
      ab --fix group_offload_keep_host --pipeline wan --setting group_offload:block_level --profile-calls 1 \
        --budget "${FIX_BUDGET:-150s}" --replace ;;
    copy-rates)  # the host's five copy rates, as every result now records them
      python3 benchmarks/copy_rates.py --out results/copy_rates/h200.json ;;
    bound)  # the trace's bound against the blocks: A/A, stalls of known cost and a real fix, on two builds, for
      # BOUND_S seconds at most (each trial is written as it ends)
      t=$(( $(left) - 25 )); [ "$t" -gt "${BOUND_S:-330}" ] && t=${BOUND_S:-330}
      timeout --signal=INT --kill-after=20 "$t" \
        python3 benchmarks/bound_calibration.py --out results/bound/calibration_h200 2>&1 | grep -v '^\s*$' | tail -20 ;;
    settings-map)  # which setting for a memory budget: each pipeline of MAPS at true size, every setting both ways
      # (going on from the map a pipeline has: its points are kept, the points it lacks measured)
      for pipeline in ${MAPS:-flux2}; do
        lab settings --pipeline "$pipeline" --size full --steps "${MAP_STEPS:-2}" --slow "${MAP_SLOW:-10}" \
          --out results/settings-map --trace-dir traces/settings-map --resume ${MAP_HOST_TRACE:+--host-trace}
      done ;;
    upstream)  # the diffs whose tests (the project's or their own) need an accelerator, checked on this GPU against
      # the suites carried as .releases/suites.tar.xz (`lab upstream check --repo` extracts them into ~/.cache/lab/suites,
      # each with the tag and commit it is); the reports go to patches/checks/gpu, beside the CPU's
      mkdir -p /tmp/check && tar xJf .releases/suites.tar.xz -C /tmp/check
      for fix in ${CHECKS:-group_offload_keep_host group_offload_top_level group_offload_pinned model_offload_keep_host \
                 model_offload_pinned sequential_offload_keep_cache sequential_offload_pinned}; do
        lab upstream check --fix "$fix" --tests diffusers=/tmp/check/suites/${DIFFUSERS_SUITE:-d035dcd7cc7c88e0a154609b62887d50bba9fdc2} \
          --tests accelerate=/tmp/check/suites/${ACCELERATE_SUITE:-beb0672aa8444ea7647aee056f624effe5996346} --offline \
          --max-files "${CHECK_FILES:-1}" --timeout 240 --test-pipelines --out patches/checks/gpu
      done ;;
    *) echo "gpu-work.sh: unknown part $part" ;;
  esac
done
find results patches/checks -type f -newer "$marker" ! -name '.*.partial*' > "$marker.list"
tar czf "$out/$pack.tgz" -T "$marker.list"
find traces -name 'census_sd35*' -o -name 'census_zimage*' 2>/dev/null | head -4 | tar czf "$out/$pack-traces.tgz" -T -
# the settings maps' profiled calls (device activity only, gzipped), smallest first while they fit a file that comes
# back (16 MiB)
find traces/settings-map -name '*.json.gz' -printf '%s %p\n' 2>/dev/null | sort -n |
  awk '{ total += $1; if (total < 15000000) print $2 }' | tar cf "$out/$pack-maps.tar" -T -
echo "$(wc -l < "$marker.list") result file(s) in $out/$pack.tgz; $(left) s left"
