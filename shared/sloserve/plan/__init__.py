"""BestServe planner (papers/bestserve.txt): Estimator, fast simulators, Optimizer."""
