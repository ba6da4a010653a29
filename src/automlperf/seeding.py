"""One seed from several integers: every random stream of a run (shuffles, crops, a
replica's choices, a trial's initialisation) derives its seed here, so the streams differ
from each other and repeat exactly on any machine."""

from __future__ import annotations

# A prime above any epoch, rank, replica index or image row a part is combined with, so
# that distinct parts give distinct seeds.
PRIME = 1_000_003


def mix_seed(*parts: int) -> int:
    """``((p0 * PRIME + p1) * PRIME + p2) ...`` below 2**63 (what torch's generators take):
    the run's seed first, then what varies."""
    seed = 0
    for part in parts:
        seed = (seed * PRIME + int(part)) % 2**63
    return seed
