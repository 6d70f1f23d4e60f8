#!/usr/bin/env bash
# Runs a campaign on a lent GPU host (the workplace's `device` tool), over a copy of this tree, and packs what it
# measured into one tarball (files come back from the host only with plain names: result names hold a `+`).
#
# The host has torch and scipy but not the lab's other dependencies, and nothing can be fetched there. Download their
# wheels here first (Python 3.12, x86-64) into .whl/ (ignored by git: `echo /.whl/ >> .git/info/exclude`), and carry
# .whl with the tree:
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl diffusers==0.37.1 libcst==1.9.0 \
#     msgspec==0.22.0 tabulate==0.10.0 peft==0.21.2 accelerate==1.15.0 dask==2026.7.1 distributed==2026.7.1 \
#     cloudpickle==3.1.3 toolz==1.2.0 partd==1.4.2 locket==1.0.0 fsspec==2026.9.0 msgpack==1.2.4 tornado==6.6.1 \
#     zict==3.0.0 tblib==3.2.2 sortedcontainers==2.4.0 click==8.5.1
# The tree that travels may hold 64 MiB with what it carries. On 2026-11-27 the device refused 56 MiB of tracked files
# (by their bytes; 60 MiB by what they take on disk) with the 6 MiB .site/, so count what they take on disk:
# `git ls-files -z | du -c --files0-from=- | tail -1` (KiB): 47 MiB since the plots became palette PNGs
# (lab/pages/figure.py). Pack the wheels unpacked into one xz tarball (6 MiB against their 13) in .site/ (ignored
# too: `echo /.site/ >> .git/info/exclude`), and carry .site rather than .whl:
#   rm -rf /tmp/site && mkdir -p .site && for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done \
#     && tar cJf .site/site.tar.xz -C /tmp site
#
# On the host, within a 10-minute call (LEFT: seconds the campaign may use, counted from this script's start; the
# campaign's --time-limit is what is left after the install; PACK: the tarball's name):
#   LAB_COMMIT=a290b4c LEFT=505 PACK=n1 bash campaigns/device.sh campaigns/settings.toml --only sequential_cpu_offload
# (LAB_COMMIT: this checkout's `git rev-parse --short HEAD`, written into the command: see below.) Every argument
# goes to `lab campaign run`, after `--gpus all --redo-undecided` (a later `--gpus 1` replaces `all`).
# Side by side, one campaign per GPU: ` ::: ` splits the arguments into groups. Those before the first go to every
# campaign, and the Nth group after it to GPU N-1's (0, 1, ...):
#   LEFT=505 HARD=588 PACK=n1 bash campaigns/device.sh campaigns/settings.toml --within-design \
#     ::: --only X1 --only X2 ::: --only Y ::: --again --only Z
# They start together once .site is unpacked, share LEFT and HARD, each log to $OUT/PACK-gpuN.log, and what they
# wrote goes into one tarball once the last has ended. LAB_HOST_CAMPAIGNS tells them how many they are: each result
# records how many jobs its host measured at once. (Before, each side-by-side campaign was its own call of this
# script: each tarball held the others' files too and the shared run log, and they had to be unpacked in the order
# they were packed, or a later one put back an older run log; 2026-11-28 lost a line of it so.)
# HARD (default LEFT + 90): seconds from this script's start by which the tarball must exist, the device call's own
# limit or less. A job stopped at the time limit takes a while to write its result and end (one of Wan's took more than
# 35 s on an H200 host, 2026-11-27, and the device's limit then ended the call before the tarball: nothing came back).
# So the campaign gets a Ctrl-C 30 s before HARD (it waits for its jobs to keep what they completed), is killed 15 s
# before it, and what it wrote by then is packed. Leave HARD at least 80 s after LEFT (51 s was too little on four
# H200s, 2026-11-28). The tarball ($OUT/PACK.tgz, or ./PACK.tgz without $OUT) holds every file under results/ that the
# run wrote. Unpack it over the tree here (`tar xzf PACK.tgz`) before the next call: the host is given this tree, so
# without it the next call measures the same cells again.
# CHECK=1 (here, before a call; no install, no GPU): each group's `lab campaign run --dry-run` with the same
# arguments, one line per job it would start, and exit 1 if a group would start none. A call on four H200s
# (2026-11-28) idled three GPUs for its 5 minutes: their cells had passed their design's most blocks in the call
# before, so `--within-design` left each group nothing to run. PYTHON names the interpreter (default python3):
#   CHECK=1 PYTHON=.venv/bin/python3 LEFT=505 bash campaigns/device.sh campaigns/settings.toml \
#     ::: --only X ::: --only Y
set -uo pipefail
# the arguments for every campaign, then each GPU's group (` ::: `), kept quoted
common=() groups=() n=0
for arg in "$@"; do
  if [ "$arg" = ":::" ]; then n=$(( n + 1 )); groups[n]=""
  elif [ "$n" -eq 0 ]; then common+=("$arg")
  else groups[n]+="$(printf '%q ' "$arg")"
  fi
done
if [ -n "${CHECK:-}" ]; then
  bad=0
  for i in $(seq 1 "$(( n > 0 ? n : 1 ))"); do
    mine=(); [ "$n" -eq 0 ] || eval "mine=(${groups[i]})"
    said=$("${PYTHON:-python3}" -m lab campaign run --workers 1 --redo-undecided --time-limit "${LEFT:-505}s" \
      "${common[@]}" "${mine[@]}" --dry-run 2>&1)
    jobs=$(grep -c ' # log: ' <<< "$said")
    if [ "$jobs" -eq 0 ]; then
      bad=1
      echo "== GPU $(( i - 1 )): nothing to run: $(grep -e 'nothing to run' -e '^ERROR' <<< "$said" | tail -1)"
    else
      echo "== GPU $(( i - 1 )): $jobs job(s)"
      grep ' # log: ' <<< "$said" | sed -e 's/.* # log: [^ ]*\/\([^/ ]*\)\.log; /  \1: /'
    fi
  done
  exit "$bad"
fi
start=$(date +%s)
site=${SITE:-/tmp/site}  # where the wheels are unpacked or installed (a test's own folder, not the host's /tmp/site)
if [ -f .site/site.tar.xz ]; then
  packed=$(sha256sum .site/site.tar.xz | cut -d' ' -f1)
  # unpacked already, from this very tarball, by another call of this script on this host
  if [ "$(cat "$site/.unpacked" 2>/dev/null)" != "$packed" ]; then
    mkdir -p "$site" && tar xJf .site/site.tar.xz -C "$site" --strip-components=1 \
      || { echo "device.sh: could not unpack .site/site.tar.xz (see this file's header)"; exit 2; }
    echo "$packed" > "$site/.unpacked"
  fi
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    || { echo "device.sh: could not install the carried wheels in .whl/ (see this file's header)"; exit 2; }
fi
export PYTHONPATH=$site PYTHONUNBUFFERED=1
# the host's copy of the tree holds git metadata from the session's start, so its HEAD can lag the checkout it copies
# (2026-11-28: a result of a290b4c recorded 35c2d3d+dirty): say the commit in the command, written where it is known
[ -n "${LAB_COMMIT:-}" ] || echo "device.sh: warning: LAB_COMMIT is not set: the results record the git HEAD of" \
  "this copy of the tree, which can lag the checkout's (start the command with LAB_COMMIT=<git rev-parse --short" \
  "HEAD, run where you write the command>)"
out=${OUT:-.}
pack=${PACK:-campaign}
marker=$(mktemp)
nvidia-smi -L > "$out/gpus.txt" 2>&1
elapsed=$(( $(date +%s) - start ))
left=$(( ${LEFT:-505} - elapsed ))
hard=$(( ${HARD:-$(( ${LEFT:-505} + 90 ))} - elapsed ))
# a Ctrl-C (the campaign keeps what its jobs completed) 30 s before the hard limit, a kill 15 s after that
[ "$hard" -gt 31 ] || { echo "device.sh: HARD leaves the campaign no time (${hard} s after the install)"; exit 2; }
[ "$(( hard - left ))" -ge 80 ] || echo "device.sh: warning: HARD is $(( hard - left )) s after LEFT, under 80 s: the" \
  "Ctrl-C may come while a job stopped at the limit is still writing (see this file's header)"
campaign() {
  timeout --signal=INT --kill-after=15 "$(( hard - 30 ))" \
    python3 -m lab campaign run --gpus all --redo-undecided --time-limit "${left}s" "$@" 2>&1
}
if [ "$n" -eq 0 ]; then
  campaign "${common[@]}" | tee "$out/$pack.log" | grep -v '^\s*$' | tail -60
else
  export LAB_HOST_CAMPAIGNS=$n  # each job's result records how many measured at once on this host
  for i in $(seq 1 "$n"); do
    eval "mine=(${groups[i]})"
    campaign "${common[@]}" --gpus "$(( i - 1 ))" "${mine[@]}" > "$out/$pack-gpu$(( i - 1 )).log" &
  done
  wait
  for i in $(seq 1 "$n"); do
    echo "== GPU $(( i - 1 )): ${groups[i]}"
    grep -e '^\[' -e 'cell(s) measured' -e '^ERROR' -e '^Time limit' "$out/$pack-gpu$(( i - 1 )).log" | tail -20
  done
fi
# (not a result's temporary file, `.NAME.XXXXXX.partial.json`, which a killed writer leaves behind)
find results -type f -newer "$marker" ! -name '.*.partial*' > "$marker.list"
tar czf "$out/$pack.tgz" -T "$marker.list"
echo "$(wc -l < "$marker.list") result file(s) in $out/$pack.tgz"
