"""Every release that changed the gradients between GOOD and BAD (gradtrace-versions --transitions), not only the
first: the range is probed every `every` releases, then each segment whose two ends differ is split at its middle
until the change sits between two neighbours, so k changes in n releases take about n / every + k * log2(every)
runs instead of a sweep's n.

`releases` is the ordered list from GOOD to BAD (both included). `ran(release)` runs a release (cached) and says
whether it ran; `compare(a, b)` says "same", "changed" or "not-compared" (the diff refused the pair, e.g. other
models: nothing measured). A release that fails is left out and its segment split at a neighbour; a change next
to failed releases is a range. A segment whose ends agree is not entered: a change that a later release reverts
inside it cannot be seen, and the result lists those segments ("unentered").

Ends that agree do not prove that nothing happened between them: a change can be reverted (DeepSpeed's MoE
double division lived from 0.12.4 to 0.13.0). So the range is first probed every `every` releases, and only
then are the segments whose ends differ split: a change undone within fewer than `every` releases can still
fall between two probes that agree, and the result lists those segments.
"""


def find(releases: list, ran, compare, every: int = 4) -> dict:
    """{"changes": [(before, after, [failed between])], "not_compared": [(before, after, [failed between])],
    "unentered": [(a, b)] (segments judged by their ends alone, more than one release apart), "probed":
    [releases run, in order], "failed": [releases that did not run]}. The ends must have run (the caller checks)."""
    failed: set = set()
    last = len(releases) - 1
    probed = {0, last}
    changes, not_compared, unentered = [], [], []
    # the grid: every `every`-th release (a failed one gives way to the next that runs before the next grid point)
    grid = [0]
    for start in range(every, last, every):
        for i in range(start, min(start + every, last)):
            probed.add(i)
            if ran(releases[i]):
                grid.append(i)
                break
            failed.add(i)
    grid.append(last)
    segments = list(reversed(list(zip(grid, grid[1:]))))  # a stack: the oldest segment on top
    while segments:
        lo, hi = segments.pop()
        verdict = compare(releases[lo], releases[hi])
        if verdict == "same":
            if hi - lo > 1:
                unentered.append((releases[lo], releases[hi]))
            continue
        inner = [i for i in range(lo + 1, hi) if i not in failed]
        if not inner:
            between = [releases[i] for i in range(lo + 1, hi)]
            (changes if verdict == "changed" else not_compared).append((releases[lo], releases[hi], between))
            continue
        mid = (lo + hi) // 2
        i = min(inner, key=lambda j: (abs(j - mid), j))  # the middle, or the nearest release not yet failed
        probed.add(i)
        if not ran(releases[i]):
            failed.add(i)
            segments.append((lo, hi))
            continue
        segments += [(i, hi), (lo, i)]  # the older half first (a stack)
    order = lambda pairs: sorted(pairs, key=lambda p: releases.index(p[0]))  # noqa: E731
    return {"changes": order(changes), "not_compared": order(not_compared), "unentered": order(unentered),
            "probed": [releases[i] for i in sorted(probed) if i not in failed],
            "failed": [releases[i] for i in sorted(failed)]}
