"""`make bench`: run every benchmark."""

from __future__ import annotations

from bench.claims import main as claims_main
from bench.scoring import main as scoring_main

if __name__ == "__main__":
    scoring_main()
    claims_main()
