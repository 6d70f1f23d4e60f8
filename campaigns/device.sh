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
#   LEFT=505 PACK=n1 bash campaigns/device.sh campaigns/settings.toml --only sequential_cpu_offload
# Every argument goes to `lab campaign run`, after `--gpus all --redo-undecided` (a later `--gpus 1` replaces `all`:
# two campaigns can share a host side by side, one per GPU, the second started once the first has unpacked .site, with
# their own PACK names; `--again --only TEXT` then re-measures one cell while the other GPU goes on with the rest).
# HARD (default LEFT + 90): seconds from this script's start by which the tarball must exist, the device call's own
# limit or less. A job stopped at the time limit takes a while to write its result and end (one of Wan's took more than
# 35 s on an H200 host, 2026-11-27, and the device's limit then ended the call before the tarball: nothing came back).
# So the campaign gets a Ctrl-C 30 s before HARD (it waits for its jobs to keep what they completed), is killed 15 s
# before it, and what it wrote by then is packed. Leave HARD at least 80 s after LEFT (51 s was too little on four
# H200s, 2026-11-28). The tarball ($OUT/PACK.tgz, or ./PACK.tgz without $OUT) holds every file under results/ that the
# run wrote. Unpack it over the tree here (`tar xzf PACK.tgz`) before the next call: the host is given this tree, so
# without it the next call measures the same cells again.
set -uo pipefail
start=$(date +%s)
if [ -f .site/site.tar.xz ]; then
  packed=$(sha256sum .site/site.tar.xz | cut -d' ' -f1)
  # unpacked already, from this very tarball, by another campaign on this host (two side by side, one per GPU)
  if [ "$(cat /tmp/site/.unpacked 2>/dev/null)" != "$packed" ]; then
    tar xJf .site/site.tar.xz -C /tmp \
      || { echo "device.sh: could not unpack .site/site.tar.xz (see this file's header)"; exit 2; }
    echo "$packed" > /tmp/site/.unpacked
  fi
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device.sh: could not install the carried wheels in .whl/ (see this file's header)"; exit 2; }
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
out=${OUT:-.}
marker=$(mktemp)
nvidia-smi -L > "$out/gpus.txt" 2>&1
elapsed=$(( $(date +%s) - start ))
left=$(( ${LEFT:-505} - elapsed ))
hard=$(( ${HARD:-$(( ${LEFT:-505} + 90 ))} - elapsed ))
# a Ctrl-C (the campaign keeps what its jobs completed) 30 s before the hard limit, a kill 15 s after that
[ "$hard" -gt 31 ] || { echo "device.sh: HARD leaves the campaign no time (${hard} s after the install)"; exit 2; }
[ "$(( hard - left ))" -ge 80 ] || echo "device.sh: warning: HARD is $(( hard - left )) s after LEFT, under 80 s: the" \
  "Ctrl-C may come while a job stopped at the limit is still writing (see this file's header)"
timeout --signal=INT --kill-after=15 "$(( hard - 30 ))" \
  python3 -m lab campaign run --gpus all --redo-undecided --time-limit "${left}s" "$@" 2>&1 \
  | tee "$out/${PACK:-campaign}.log" | grep -v '^\s*$' | tail -60
# (not a result's temporary file, `.NAME.XXXXXX.partial.json`, which a killed writer leaves behind)
find results -type f -newer "$marker" ! -name '.*.partial*' > "$marker.list"
tar czf "$out/${PACK:-results}.tgz" -T "$marker.list"
echo "$(wc -l < "$marker.list") result file(s) in $out/${PACK:-results}.tgz"
