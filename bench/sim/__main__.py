"""`python -m bench.sim`: the paper-scale ablation."""

from bench.sim.run import main

raise SystemExit(main())
