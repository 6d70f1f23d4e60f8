"""Strip tqdm progress bars from a GPU campaign log before it is committed to results/logs/.

    python benchmarks/strip_progress.py CAMPAIGN_LOG OUT

A progress bar rewrites its line with carriage returns: each bar (`  25%|██▌  | 1/4 [00:00<00:00, 6.19it/s]`) at
the start of a `\\r`-separated segment is dropped, what follows it on the segment (a warning printed mid-bar) is
kept, and a line left with nothing but bars goes.
"""

import re
import sys

BAR = re.compile(r"^\s*\d+%\|[^|]*\|\s*\d+/\d+ \[[^\]]*\]")


def strip(text: str) -> str:
    out = []
    for line in text.split("\n"):
        kept = []
        for segment in line.split("\r"):
            bare = segment
            while (m := BAR.match(bare)):
                bare = bare[m.end():]
            if bare.strip() or bare == segment:  # text after a bar (a warning) stays; a bar alone goes
                kept.append(bare)
        if line.strip() and not "".join(kept).strip():
            continue
        out.append("".join(kept))
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1:]
    with open(src, encoding="utf-8", errors="replace") as f:
        text = f.read()
    with open(dst, "w", encoding="utf-8") as f:
        f.write(strip(text))
