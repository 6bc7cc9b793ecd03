"""`make bench`: run every benchmark."""

from __future__ import annotations

import sys

from bench.calibration import main as calibration_main
from bench.claim_hub import main as claim_hub_main
from bench.claims import main as claims_main
from bench.history import main as history_main
from bench.pipeline import main as pipeline_main
from bench.scoring import main as scoring_main
from bench.stages import main as stages_main
from bench.trace_size import main as trace_size_main
from streams.harness import stop_on_sigterm

if __name__ == "__main__":
    stop_on_sigterm()  # the pipeline benchmark's broker and workers stop with it
    scoring_main()
    claims_main()
    claim_hub_main()
    history_main()
    trace_size_main()
    calibration_main()
    stages_main()
    sys.exit(pipeline_main())
