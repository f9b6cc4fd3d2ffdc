"""Binary search for the first bad release, as git bisect does it (gradtrace-versions --bisect).

`releases` is the ordered list from GOOD to BAD (both included); `verdict(release)` runs a release and says
"good" (same gradients as GOOD), "bad" (changed) or "skip" (its env, its run or its diff failed: nothing measured). Only the releases
the search visits are run. A skipped release is left out and the search goes on with a neighbour, so the
answer may be a range: every release between the last good and the first bad was skipped.
"""


def bisect(releases: list, verdict) -> dict:
    """{"first_bad": release or None, "last_good": release, "skipped_between": [...], "visited": [(r, v)]}.
    The ends are not visited: GOOD is good and BAD is bad by the caller's word (it checks them first)."""
    lo, hi = 0, len(releases) - 1  # releases[lo] good, releases[hi] bad
    skipped = set()
    visited = []
    while True:
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            break
        mid = (lo + hi) // 2
        i = min(inner, key=lambda j: (abs(j - mid), j))  # the middle, or the nearest untried neighbour
        v = verdict(releases[i])
        visited.append((releases[i], v))
        if v == "skip":
            skipped.add(i)
        elif v == "good":
            lo = i
        else:
            hi = i
    between = [releases[i] for i in range(lo + 1, hi)]
    return {"first_bad": releases[hi] if not between else None, "last_good": releases[lo],
            "first_bad_or_skipped": releases[hi], "skipped_between": between, "visited": visited}
